"""Recursion through guarded calls: the same depth as unguarded, less one frame per level.

A guarded call costs the wrapper's frame; CPython 3.10 and 3.11 also count the proxy's
C-level ``__call__`` (wrapt) as a level, where 3.12 counts Python frames only (What's New
in 3.12, ``sys.setrecursionlimit``). A recursive stage would then stop at a third of its
unguarded depth instead of a half. There, each guarded call made while another one runs
on the same thread gives that level back: the limit is one higher until it returns.

The program's own limit stands: if it sets one while levels are given back, those levels
are not taken back from its value.
"""

from __future__ import annotations

import _thread
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class GiveBackCLevel:
    """A context manager around the wrapper's call of the original (nested calls only)."""

    def __init__(self) -> None:
        self._local = _thread._local()
        self._lock = _thread.allocate_lock()
        self._expected = 0  # the limit as this class last left it (0: not yet known)
        self._given = 0  # levels given back since the program last set the limit
        self._era = 0  # counts the program's own changes of the limit

    def __enter__(self) -> None:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        if not stack:  # the outermost guarded call on this thread: nothing to give back
            stack.append(None)
            return
        with self._lock:
            limit = self._current()
            sys.setrecursionlimit(limit + 1)
            self._expected, self._given = limit + 1, self._given + 1
            stack.append(self._era)

    def __exit__(self, *exc: Any) -> None:
        era = self._local.stack.pop()
        if era is None:
            return
        with self._lock:
            limit = self._current()
            if era != self._era or self._given == 0:
                return  # the program set its own limit since: it stands
            try:
                sys.setrecursionlimit(limit - 1)
            except RecursionError:  # right at the limit: take the level back later
                return
            self._expected, self._given = limit - 1, self._given - 1

    def _current(self) -> int:
        """The limit now; a value this class did not leave starts a new era."""
        limit = sys.getrecursionlimit()
        if limit != self._expected:
            self._era += 1
            self._given = 0
            self._expected = limit
        return limit

    def after_fork_in_child(self) -> None:
        self._lock = _thread.allocate_lock()


GIVE_BACK: GiveBackCLevel | None = None
if sys.version_info < (3, 12) and sys.implementation.name == "cpython":
    GIVE_BACK = GiveBackCLevel()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=GIVE_BACK.after_fork_in_child)
