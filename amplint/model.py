"""Plain data shared by the checker, the fixer, the reporters and the tracer.

Nothing here imports libcst or torch: findings cross process boundaries and live in the cache.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class Applicability(str, enum.Enum):
    SAFE = "safe"
    UNSAFE = "unsafe"


@dataclass(frozen=True)
class Edit:
    """Replace the text between two 1-based (line, column) positions; columns count characters."""

    line: int
    column: int
    end_line: int
    end_column: int
    content: str


@dataclass(frozen=True)
class Fix:
    applicability: Applicability
    edits: tuple[Edit, ...]

    def to_json(self) -> dict:
        return {"applicability": self.applicability.value, "edits": [asdict(e) for e in self.edits]}


@dataclass(frozen=True)
class Finding:
    code: str
    name: str
    severity: Severity
    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    message: str
    fix: Fix | None = None
    # The line a noqa comment must sit on: the first line of the reported statement.
    noqa_line: int | None = field(default=None, compare=False)

    def fixable(self, unsafe: bool) -> bool:
        """Whether `--fix` applies this finding's fix (an unsafe one only with `--unsafe-fixes`)."""
        return self.fix is not None and (unsafe or self.fix.applicability is Applicability.SAFE)

    def to_json(self) -> dict:
        return {
            "code": self.code,
            "name": self.name,
            "severity": self.severity.value,
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "end_line": self.end_line,
            "end_column": self.end_column,
            "message": self.message,
            "fix": self.fix.to_json() if self.fix else None,
        }

    @classmethod
    def from_json(cls, data: dict) -> Finding:
        fix = data.get("fix")
        return cls(
            code=data["code"],
            name=data["name"],
            severity=Severity(data["severity"]),
            path=data["path"],
            line=data["line"],
            column=data["column"],
            end_line=data["end_line"],
            end_column=data["end_column"],
            message=data["message"],
            fix=Fix(Applicability(fix["applicability"]), tuple(Edit(**e) for e in fix["edits"]))
            if fix
            else None,
            noqa_line=data.get("noqa_line"),
        )

    def sort_key(self) -> tuple:
        return (self.path, self.line, self.column, self.code)


@dataclass(frozen=True)
class RuleInfo:
    """A rule's catalogue entry, read from the front matter and body of `rules/AMPxxx.md`."""

    code: str
    name: str
    severity: Severity
    summary: str
    fix: str  # "safe", "unsafe" or "none"
    runtime: str  # how `amplint trace` confirms it, one line
    doc: str  # the Markdown body
