"""The on-disk cache that keeps ``tomllib`` and ``importlib.metadata`` out of start-up.

Importing tomllib costs ~4 ms and scanning distributions for entry points tens of
milliseconds, most of the start-up budget. Parsed policy tables and the entry-point list
are kept in one ``marshal`` file per environment (data only: marshal cannot run code)
under ``$XDG_CACHE_HOME/autograd-guard``. ``AUTOGRAD_GUARD_CACHE=off`` turns it off.
"""

from __future__ import annotations

import marshal
import os

from autograd_guard import _environment

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class DiskCache:
    """Parsed policy files, keyed by path and checked against the exact bytes.

    Importing tomllib costs ~4 ms, most of the start-up budget, so the parsed tables are
    kept in one ``marshal`` file (data only: marshal cannot run code) under
    ``$XDG_CACHE_HOME/autograd-guard``. ``AUTOGRAD_GUARD_CACHE=off`` turns it off.
    """

    MAX_ENTRIES = 32
    _shared: DiskCache | None = None

    def __init__(self, folder: str | None) -> None:
        self.file = os.path.join(folder, "policies.marshal") if folder else None
        self.entries: dict[str, tuple[bytes, dict[str, Any]]] | None = None

    @classmethod
    def shared(cls) -> DiskCache:
        if cls._shared is None:
            cls._shared = cls(_environment.cache_folder())
        return cls._shared

    def get(self, path: str, raw: bytes) -> dict[str, Any] | None:
        """The data stored for ``path`` (a file, or a ``<name>`` of our own) if ``raw``
        is still what it was."""
        entry = self._load().get(_cache_key(path))
        if entry is not None and entry[0] == raw:
            return entry[1]
        return None

    def put(self, path: str, raw: bytes, data: dict[str, Any]) -> None:
        entries = self._load()
        entries[_cache_key(path)] = (raw, data)
        while len(entries) > self.MAX_ENTRIES:
            del entries[next(iter(entries))]
        if self.file is None:
            return
        try:  # best effort: a read-only home only costs the parse next time
            os.makedirs(os.path.dirname(self.file), exist_ok=True)
            temporary = f"{self.file}.{os.getpid()}.tmp"
            with open(temporary, "wb") as f:
                marshal.dump(entries, f)
            os.replace(temporary, self.file)
        except (OSError, ValueError):
            pass

    def _load(self) -> dict[str, tuple[bytes, dict[str, Any]]]:
        if self.entries is None:
            self.entries = {}
            if self.file is not None:
                try:
                    with open(self.file, "rb") as f:
                        loaded = marshal.load(f)
                    if isinstance(loaded, dict):
                        self.entries = {k: v for k, v in loaded.items() if _valid_entry(k, v)}
                except (OSError, EOFError, ValueError, TypeError):
                    pass
        return self.entries


def _cache_key(path: str) -> str:
    return path if path.startswith("<") else os.path.abspath(path)


def _valid_entry(key: object, value: object) -> bool:
    return (
        isinstance(key, str)
        and isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], bytes)
        and isinstance(value[1], dict)
    )
