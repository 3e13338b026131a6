"""The on-disk cache that keeps start-up down to a few file reads.

Importing tomllib costs ~4 ms, scanning distributions for entry points tens of
milliseconds, and building the policy and the guards several more. So three things are
kept, as data only (``marshal`` cannot run code), in files of each Python environment's
own under ``$XDG_CACHE_HOME/autograd-guard`` (two environments that alternate never evict
each other's entries), one file per kind, so that a start reads only the small plans:

- parsed policy tables, checked against the file's exact bytes;
- the guard entry points found in the environment, checked against the mtimes of the
  folders on ``sys.path`` (installing a distribution changes its folder's mtime);
- start plans: which modules a process must watch, checked against the policy files'
  sizes and checksums, so that the engine itself is imported only when one of them is.

A file with another schema, or an entry of the wrong shape, is ignored (and rewritten),
never trusted. ``AUTOGRAD_GUARD_CACHE=off`` turns the cache off.
"""

from __future__ import annotations

import marshal
import os

from autograd_guard._common import CACHE_SCHEMA, STATE, cache_file, cache_folder, read_entries
from autograd_guard._common import path_fingerprint as path_fingerprint  # where callers find it

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SCHEMA = CACHE_SCHEMA
MAX_ENTRIES = 32  # per kind: parsed tables, plans


class DiskCache:
    """The cache files of this environment (``sys.prefix``): ``tables`` and ``plans``."""

    def __init__(self, folder: str | None) -> None:
        self.folder = folder
        self.file = self.file_of("tables")
        self.sections: dict[str, dict[str, Any]] = {}

    def file_of(self, section: str) -> str | None:
        return cache_file(self.folder, section)

    @classmethod
    def shared(cls) -> DiskCache:
        """The cache of the folder the environment names now (``XDG_CACHE_HOME`` and
        ``HOME`` may change while the program runs, as each test's do)."""
        folder = cache_folder()
        shared: DiskCache | None = STATE.disk_cache
        if shared is None or shared.folder != folder:
            shared = STATE.disk_cache = cls(folder)
        return shared

    def get(self, path: str, raw: bytes) -> dict[str, Any] | None:
        """The data stored for ``path`` (a file, or a ``<name>`` of our own) if ``raw``
        is still what it was."""
        entry = self._section("tables").get(_cache_key(path))
        if isinstance(entry, tuple) and len(entry) == 2 and entry[0] == raw:
            data = entry[1]
            return data if isinstance(data, dict) else None
        return None

    def put(self, path: str, raw: bytes, data: dict[str, Any]) -> None:
        self._store("tables", _cache_key(path), (raw, data))

    def plan(self, key: str) -> Any:
        return self._section("plans").get(key)

    def put_plan(self, key: str, plan: Any) -> None:
        self._store("plans", key, plan)

    def _section(self, name: str) -> dict[str, Any]:
        if name not in self.sections:
            self.sections[name] = read_entries(self.file_of(name))
        return self.sections[name]

    def _store(self, section: str, key: str, value: Any) -> None:
        entries = self._section(section)
        entries.pop(key, None)
        entries[key] = value  # newest last
        while len(entries) > MAX_ENTRIES:
            del entries[next(iter(entries))]
        file = self.file_of(section)
        if file is None:
            return
        try:  # best effort: a read-only home only costs the slow start next time
            os.makedirs(os.path.dirname(file), exist_ok=True)
            temporary = f"{file}.{os.getpid()}.tmp"
            with open(temporary, "wb") as f:
                marshal.dump({"schema": SCHEMA, "entries": entries}, f)
            os.replace(temporary, file)
        except (OSError, ValueError):
            pass


def _cache_key(path: str) -> str:
    return path if path.startswith("<") else os.path.abspath(path)
