"""SARIF 2.1.0, as GitHub code scanning accepts it, with rule help taken from `rules/`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TextIO
from urllib.parse import quote

from amplint import __version__
from amplint.catalogue import catalogue, doc_section
from amplint.model import Finding, Severity

_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
_HOME = "https://github.com/amplint/amplint"


def _uri(path: str) -> str:
    """A relative path stays relative (GitHub resolves it against the repository root); both kinds
    are percent-encoded, so spaces and `#` in file names make valid URI references."""
    candidate = Path(path)
    if candidate.is_absolute():
        return candidate.as_uri()
    return quote(os.fsencode(candidate.as_posix()), safe="/")  # bytes: a name that is not UTF-8 too


def render(findings: list[Finding], out: TextIO, context: dict) -> None:
    rules = list(catalogue().values())
    index = {rule.code: i for i, rule in enumerate(rules)}
    driver = {
        "name": "amplint",
        "version": __version__,
        "semanticVersion": __version__,
        "informationUri": _HOME,
        "rules": [
            {
                "id": rule.code,
                "name": rule.name,
                "shortDescription": {"text": rule.summary},
                "fullDescription": {"text": doc_section(rule, "What it flags") or rule.summary},
                "help": {"text": rule.doc, "markdown": rule.doc},
                "helpUri": f"{_HOME}/blob/main/rules/{rule.code}.md",
                "defaultConfiguration": {"level": _LEVEL[rule.severity]},
                "properties": {"tags": ["pytorch", "amp", "mixed-precision"], "fix": rule.fix},
            }
            for rule in rules
        ],
    }
    results = []
    for f in findings:
        result = {
            "ruleId": f.code,
            "ruleIndex": index[f.code],
            "level": _LEVEL[f.severity],
            "message": {"text": f.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": _uri(f.path)},
                        "region": {
                            "startLine": f.line,
                            "startColumn": f.column,
                            "endLine": f.end_line,
                            "endColumn": f.end_column,
                        },
                    }
                }
            ],
        }
        if f.fix is not None:
            result["fixes"] = [
                {
                    "description": {"text": f"{f.fix.applicability.value} fix for {f.code}"},
                    "artifactChanges": [
                        {
                            "artifactLocation": {"uri": _uri(f.path)},
                            "replacements": [
                                {
                                    "deletedRegion": {
                                        "startLine": e.line,
                                        "startColumn": e.column,
                                        "endLine": e.end_line,
                                        "endColumn": e.end_column,
                                    },
                                    "insertedContent": {"text": e.content},
                                }
                                for e in f.fix.edits
                            ],
                        }
                    ],
                }
            ]
        results.append(result)
    run = {
        "tool": {"driver": driver},
        # Columns count characters (code points), as libcst's positions do.
        "columnKind": "unicodeCodePoints",
        "results": results,
    }
    log = {"$schema": _SCHEMA, "version": "2.1.0", "runs": [run]}
    json.dump(log, out, indent=2)
    out.write("\n")
