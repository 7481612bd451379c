"""Positions computed per unit (innermost def/class, else top-level statement) equal libcst's
positions over the whole file, for every node the facts pass saw, on every fixture."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from amplint.static.analyse import _Locator, parse
from amplint.static.semantics import AmpFacts
from amplint.static.source import SourceError, decode_source

ROOT = Path(__file__).parent.parent
SOURCES = sorted(
    p for p in [*ROOT.glob("fixtures/static/*/*.py"), *ROOT.glob("fixtures/fix/*.py"), *ROOT.glob("examples/*.py")]
)


# Whitespace and comment nodes are never reported; where they start before an indentation is
# not carried over.
TRIVIA = (cst.BaseParenthesizableWhitespace, cst.EmptyLine, cst.TrailingWhitespace, cst.Newline, cst.Comment)


def _nodes_and_locator(text: str) -> tuple[dict[int, cst.CSTNode], _Locator, cst.Module]:
    module = parse(text)
    facts = AmpFacts(module, None, text)
    nodes: dict[int, cst.CSTNode] = {}

    class Collect(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            nodes[id(node)] = node
            return True

    module.visit(Collect())
    return nodes, _Locator(module, text, facts), module


def _assert_same_positions(text: str) -> int:
    nodes, locator, module = _nodes_and_locator(text)
    whole = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    checked = 0
    for key, node in nodes.items():
        if locator.facts.unit_of.get(key) is None or isinstance(node, TRIVIA):
            continue
        assert locator.locate(node) == whole[node], (type(node).__name__, whole[node])
        checked += 1
    assert checked > 0 or not module.body
    if locator._origins:  # CPython 3.11 parses it too (not so for 3.12-only syntax)
        assert locator._whole is None, "every node was placed through its unit, none through the whole file"
    return checked


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_unit_positions_equal_whole_file_positions(path: Path) -> None:
    try:
        text, _ = decode_source(path.read_bytes())
        parse(text)
    except SourceError:
        pytest.skip("does not parse: AMP000 has no node positions")
    _assert_same_positions(text)


NESTED = """\
import torch


class Trainer:
    scale = 2.0  # a class attribute: its unit is the class

    @staticmethod
    @torch.no_grad()
    def evaluate(model,
                 batch):  # a continuation line keeps its own column
        return model(batch).half()

    class Inner:
      def two_space_body(self):
          with torch.autocast("cuda"):
              loss = (self.a +
  self.b)
          loss.backward()

    def train(self, loader):
        text = '''
inside a string'''
# a comment at column 0 inside a method
        for x in loader:
            with torch.autocast("cuda"): y = x; z = y
            z.backward(); self.step()
"""


def test_nested_methods_continuations_strings_and_comments_keep_their_columns() -> None:
    assert _assert_same_positions(NESTED) > 50


def test_crlf_files_keep_their_positions() -> None:
    assert _assert_same_positions(NESTED.replace("\n", "\r\n")) > 50


CLOSED_ON_ITS_OWN_LINE = """\
import torch


class Rotary(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        t,
    ) -> torch.Tensor:
        return t.float()
"""


def test_parameters_closed_on_a_line_of_their_own_end_after_its_indentation() -> None:
    """libcst writes the indentation before `)` as the block's, empty once the method is a unit."""
    assert _assert_same_positions(CLOSED_ON_ITS_OWN_LINE) > 10


TABBED = """\
import torch
class Model(torch.nn.Module):
\tdef forward(self, x):
\t\twith torch.autocast("cuda"):
\t\t\ty = self.net(x,
\t\t\t             x)
\t\ty.backward()
"""


def test_tab_indented_files_keep_their_positions() -> None:
    assert _assert_same_positions(TABBED) > 20


def test_the_parts_of_an_import_are_placed_through_its_unit() -> None:
    text = "import os\n\n\ndef f():\n    import torch.cuda.amp as amp\n    return amp\n"
    nodes, locator, _ = _nodes_and_locator(text)
    alias = next(n for n in nodes.values() if isinstance(n, cst.ImportAlias) and n.asname is not None)
    assert locator.locate(alias).start == cst.metadata.CodePosition(5, 11)
    assert locator._whole is None


def test_a_node_the_facts_pass_skipped_is_found_through_its_finding() -> None:
    text = "class Trainer:\n    def fit(self):\n        pass\n"
    nodes, locator, _ = _nodes_and_locator(text)
    method = next(n for n in nodes.values() if isinstance(n, cst.FunctionDef))
    assert locator.facts.unit_of.get(id(method.name)) is None  # a def's own name is not visited
    assert locator.locate(method.name, near=(method,)).start == cst.metadata.CodePosition(2, 8)
    assert locator._whole is None


# --- the parent map the facts pass records ----------------------------------------------------

STRUCTURE = (cst.Call, cst.SimpleStatementLine, cst.BaseCompoundStatement, cst.IndentedBlock, cst.Else,
             cst.Decorator, cst.AssignTarget, cst.Arg, cst.WithItem)


class _AllParents(cst.CSTVisitor):
    def __init__(self) -> None:
        self.parent: dict[int, cst.CSTNode] = {}
        self.nodes: list[cst.CSTNode] = []
        self.stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.stack:
            self.parent[id(node)] = self.stack[-1]
        self.nodes.append(node)
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.stack.pop()


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_parents_recorded_by_the_facts_pass_are_the_trees_parents(path: Path) -> None:
    try:
        text, _ = decode_source(path.read_bytes())
        module = parse(text)
    except SourceError:
        pytest.skip("does not parse")
    facts = AmpFacts(module, None, text)
    full = _AllParents()
    module.visit(full)
    for node in full.nodes:
        if id(node) in facts.parent_of:
            assert facts.parent_of[id(node)] is full.parent[id(node)], type(node).__name__
        elif isinstance(node, STRUCTURE):
            raise AssertionError(f"no parent recorded for a {type(node).__name__}")
