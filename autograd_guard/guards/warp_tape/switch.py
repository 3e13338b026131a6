"""Whether ``warp_tape``'s wrappers run at all: on while a tape keeps reads or has its
``backward()`` fixed (and, where ``wp.launch`` is wrapped rather than given its prelude,
while a tape records); off otherwise, so that Warp's calls cost nothing then.

``on`` is the list the targets name as their ``switch`` (wrapt's ``enabled``: a list's
truth costs no Python call), and the one ``wp.launch``'s prelude tests (see ``.prelude``,
which runs while a tape records as well). A tape's first recorded launch keeps its reads and
switches on (``keep``); where ``wp.launch`` is wrapped, a tape's ``__enter__`` (after Warp
accepted it) counts a recording and switches on too. Only the tapes' own steps switch off
(``__exit__``, ``backward()``, ``reset()``, a tape's death), and only once no tape is counted
recording, none keeps reads and no ``backward()`` is being fixed (``settle``: read under
the lock that ``keep`` takes, so that a tape starting to keep reads on one thread is never
switched off by another's settling). A launch never does: Warp pauses a recording
by setting ``runtime.tape`` to None around its own launches (``warp.fem``), and a launch
on another thread must not switch off a recording that is starting on this one.
"""

from __future__ import annotations

import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class Switch:
    __slots__ = ("_lock", "on", "recording", "value")

    def __init__(self, value: Any = True) -> None:
        self.value = value  # what ``on`` holds when on (wp.launch's prelude calls it)
        self.on: list[Any] = []
        self.recording = 0  # tapes entered and not yet exited
        # re-entrant: a tape's death (a weakref callback) may settle during a collection
        self._lock = threading.RLock()

    def entered(self) -> None:
        with self._lock:
            self.recording += 1
            self.on[:] = [self.value]

    def recording_already(self) -> None:
        """The guard was installed while a tape records: its ``__exit__`` ends it."""
        with self._lock:
            if not self.recording:
                self.recording = 1
                self.on[:] = [self.value]

    def keep(self, live: list[Any], reads: Any) -> None:
        """A tape's ``reads`` made the last of the ``live`` ones under the lock, then on."""
        with self._lock:
            if reads in live:
                live.remove(reads)
            live.append(reads)
            if not self.on:
                self.on[:] = [self.value]

    def uncounted(self) -> None:
        """Recordings are not counted (wp.launch's prelude sees them for itself)."""
        with self._lock:
            self.recording = 0

    def exited(self) -> None:
        with self._lock:
            self.recording = max(0, self.recording - 1)

    def settle(self, idle: Callable[[], bool]) -> None:
        """Off if no tape is counted recording and ``idle()``: no reads kept, no
        backward() being fixed."""
        with self._lock:
            if not self.recording and idle():
                self.on.clear()
