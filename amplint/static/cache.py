"""A per-project result cache, like ruff's: one JSON file per (amplint version, configuration).

An entry is keyed by the file's absolute path and checked against its size and mtime, then its
content hash; any change of the bytes, the configuration or the amplint version misses. Writes
go through a temporary file and `os.replace`, so two amplint processes running at once each
leave a complete cache (the last one wins) and a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from amplint import __version__


def content_hash(source: bytes) -> str:
    return hashlib.blake2b(source, digest_size=16).hexdigest()


class ResultCache:
    def __init__(self, folder: Path, fingerprint: str) -> None:
        key = hashlib.blake2b(f"{__version__}\0{fingerprint}".encode(), digest_size=12).hexdigest()
        self.folder = folder
        self.file = folder / __version__ / f"{key}.json"
        self.entries: dict[str, list] = {}
        self.dirty = False
        try:
            self.entries = json.loads(self.file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.entries = {}

    def lookup_stat(self, path: str, stat: os.stat_result) -> list[dict] | None:
        """Findings (as JSON, without paths) when size and mtime are unchanged."""
        entry = self.entries.get(path)
        if entry and entry[0] == stat.st_size and entry[1] == stat.st_mtime_ns:
            return entry[3]
        return None

    def lookup_hash(self, path: str, stat: os.stat_result, digest: str) -> list[dict] | None:
        """Findings when the content is unchanged though the file was touched."""
        entry = self.entries.get(path)
        if entry and entry[2] == digest:
            entry[0], entry[1] = stat.st_size, stat.st_mtime_ns
            self.dirty = True
            return entry[3]
        return None

    def store(self, path: str, stat: os.stat_result, digest: str, findings: list[dict]) -> None:
        self.entries[path] = [stat.st_size, stat.st_mtime_ns, digest, findings]
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            ignore = self.folder / ".gitignore"
            if not ignore.exists():
                ignore.write_text("# Created by amplint.\n*\n", encoding="utf-8")
            import tempfile

            handle, temporary = tempfile.mkstemp(dir=self.file.parent, prefix=".tmp-", suffix=".json")
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(self.entries, out, separators=(",", ":"))
            os.replace(temporary, self.file)
        except OSError:
            pass  # a read-only checkout still lints; it just does not cache
