"""The JSON findings contract of DESIGN.md: an array of objects, 1-based lines and columns."""

from __future__ import annotations

import json
from typing import TextIO

from amplint.model import Finding


def render(findings: list[Finding], out: TextIO, context: dict) -> None:
    json.dump([f.to_json() for f in findings], out, indent=2)
    out.write("\n")
