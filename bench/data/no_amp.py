"""Plain utilities with no AMP code: pre-commit must pass over this file without importing libcst."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def file_digest(path: Path, chunk: int = 1 << 16) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def load_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def chunked(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]
