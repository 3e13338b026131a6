"""Recursion through guarded calls: the same depth as unguarded, less one frame per level.

A guarded call costs the wrapper's frame; CPython 3.10 and 3.11 also count the proxy's
C-level ``__call__`` (wrapt) as a level, where 3.12 counts Python frames only (What's New
in 3.12, ``sys.setrecursionlimit``). A recursive stage would then stop at a third of its
unguarded depth instead of a half. There, each guarded call made while another one runs
on the same thread gives that level back: the limit is one higher until it returns.

The limit is the interpreter's, not the thread's. Lowering it below the depth of another
thread that went deeper meanwhile makes CPython abort ("Cannot recover from stack
overflow"), so levels are given back only while no other Python thread runs, and taken
back only then (later, if a thread has started since). The program's own limit stands: if
it sets one while levels are given back, those levels are not taken back from its value.

The program sees the levels given back: ``sys.getrecursionlimit()`` inside a nested guarded
call reads one higher per guarded level around it. Nothing else gives the level back: the
C-level call is counted by the interpreter's own counter, which Python cannot lower, and
a ``sys.getrecursionlimit`` of ours would change a function of the standard library for
every caller (and not what C code reads).
"""

from __future__ import annotations

import _thread
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class GiveBackCLevel:
    """A context manager around the wrapper's call of the original, for a guarded call made
    while another one runs on the thread (``running.call``, set by the outermost one)."""

    def __init__(self) -> None:
        self.running = _thread._local()  # .call: a guarded call runs on this thread
        self._local = _thread._local()  # .stack: per level, its era or None (not given)
        self._lock = _thread.allocate_lock()
        self._expected = 0  # the limit as this class last left it (0: not yet known)
        self._owed = 0  # levels given back and returned, not yet taken back
        self._era = 0  # counts the program's own changes of the limit

    def __enter__(self) -> None:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        if _thread._count():  # other threads: see the module's docstring
            stack.append(None)
            return
        with self._lock:
            limit = self._current()
            sys.setrecursionlimit(limit + 1)
            self._expected = limit + 1
            stack.append(self._era)

    def __exit__(self, *exc: Any) -> None:
        era = self._local.stack.pop()
        if era is None:
            return
        with self._lock:
            limit = self._current()
            if era != self._era:
                return  # the program set its own limit since: it stands
            self._owed += 1
            if _thread._count():
                return  # taken back once this thread is alone again
            try:
                sys.setrecursionlimit(limit - self._owed)
            except RecursionError:  # this thread is still that deep: later
                return
            self._expected, self._owed = limit - self._owed, 0

    def _current(self) -> int:
        """The limit now; a value this class did not leave starts a new era."""
        limit = sys.getrecursionlimit()
        if limit != self._expected:
            self._era += 1
            self._owed = 0
            self._expected = limit
        return limit

    def after_fork_in_child(self) -> None:
        self._lock = _thread.allocate_lock()


GIVE_BACK: GiveBackCLevel | None = None
if sys.version_info < (3, 12) and sys.implementation.name == "cpython":
    GIVE_BACK = GiveBackCLevel()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=GIVE_BACK.after_fork_in_child)
