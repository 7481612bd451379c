"""A per-project result cache, like ruff's: one JSON file per (amplint version, configuration).

An entry is keyed by the file's absolute path and checked against its size, mtime and ctime (the
kernel updates ctime on every write, and no tool can set it back), then its content hash; any
change of the bytes, the configuration or the amplint version misses. Writes
go through a temporary file and `os.replace`, so two amplint processes running at once each
leave a complete cache (the last one wins) and a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from amplint import __version__


def content_hash(source: bytes, size: int = 16) -> str:
    import hashlib  # not imported by a run without a cache

    return hashlib.blake2b(source, digest_size=size).hexdigest()


_FINDING_KEYS = frozenset({"code", "name", "severity", "line", "column", "end_line", "end_column", "message"})


def _well_formed(entry: object) -> bool:
    """[stat key, content hash, findings], as `store` writes it."""
    return (
        isinstance(entry, list)
        and len(entry) == 3
        and isinstance(entry[0], list)
        and isinstance(entry[1], str)
        and isinstance(entry[2], list)
        and all(isinstance(f, dict) and _FINDING_KEYS <= f.keys() for f in entry[2])
    )


def _stat_key(stat: os.stat_result) -> list[int]:
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


class ResultCache:
    def __init__(self, folder: Path, fingerprint: str) -> None:
        key = content_hash(f"{__version__}\0{fingerprint}".encode(), size=12)
        self.folder = folder
        self.file = folder / __version__ / f"{key}.json"
        self.entries: dict[str, list] = {}
        self.dirty = False
        try:
            loaded = json.loads(self.file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            loaded = {}
        # A cache written by hand or by another tool is ignored entry by entry, never trusted.
        if isinstance(loaded, dict):
            self.entries = {path: entry for path, entry in loaded.items() if _well_formed(entry)}

    def lookup_stat(self, path: str, stat: os.stat_result) -> list[dict] | None:
        """Findings (as JSON, without paths) when the file has not been written since."""
        entry = self.entries.get(path)
        if entry and entry[0] == _stat_key(stat):
            return entry[2]
        return None

    def previous(self, path: str) -> tuple[str, list[dict]] | None:
        """The content hash and findings stored for a file whose stat changed: whoever reads the
        file reuses them if the bytes are unchanged (a touch, a checkout of the same content)."""
        entry = self.entries.get(path)
        return (entry[1], entry[2]) if entry else None

    def store(self, path: str, stat: os.stat_result, digest: str, findings: list[dict]) -> None:
        self.entries[path] = [_stat_key(stat), digest, findings]
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
