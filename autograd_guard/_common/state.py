"""The process's guard state, in one object with a reset (as structlog's ``_config``).

Every engine module keeps what it must remember here instead of in module globals, so
that tests and ``uninstall()`` can see and reset it in one place, and a forked child gets
fresh locks in one place. A leaf module: the bootstrap imports it at interpreter start.
"""

from __future__ import annotations

import _thread
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class State:
    """What the guard remembers in this process."""

    def __init__(self) -> None:
        self.started = False  # the auto-load ran (bootstrap)
        self.summary_registered = False  # atexit runs the summary (once per process)
        self.make_locks()
        self.reset()

    def make_locks(self) -> None:
        self.engine_lock = _thread.RLock()  # install / uninstall / status
        self.import_lock = _thread.RLock()  # post-import hooks
        self.patch_lock = _thread.RLock()  # patches applied and undone
        self.event_lock = _thread.allocate_lock()  # event counts and listeners
        self.logger_lock = _thread.allocate_lock()  # building the logger (imports structlog)

    def reset(self) -> None:
        """Forget everything: the install, the events, the guards registered in code and
        what was cached (for tests; patches must be undone first, see ``uninstall()``)."""
        self.error: str | None = None
        self.registered: list[Any] = []  # guard classes added by ``guards.register``
        self.forget_install()
        # events
        self.counts: dict[tuple[str, str, str], int] = {}  # since the last reset
        self.totals: dict[tuple[str, str, str], int] = {}  # the process's, for the summary
        self.listeners: list[Any] = []
        self.log = "stderr"  # where events go: the policy's ``log`` key
        self.log_source = "default"  # where that was set, for messages
        self.logger: Any = None
        self.exit_checks: list[Any] = []  # run at exit, before the summary
        self.exit_status = 0  # strict: a finding ends the process with this status
        self.exit_pid = 0  # the process that found it
        self.muted = False  # a command of the command line runs: events are counted, not shown
        self.process: tuple[int, str] | None = None

    def forget_install(self) -> None:
        """Forget the installed policy and guards, hooks, patches and caches (what
        ``uninstall()`` leaves behind once it has undone the patches and hooks); events,
        registered guards and the last policy error are kept."""
        # engine
        self.policy: Any = None
        self.guards: list[Any] = []
        # post-import hooks
        self.hooks: dict[str, list[Any]] = {}
        self.finder: Any = None
        # patches: (owner, attribute, original, replacement), undone in reverse
        self.applied: list[tuple[object, str, object, object]] = []
        # the modules of traceable copies of remedies (_compiled.traceable), by name
        self.traced_modules: list[str] = []
        # caches: installed versions by distribution (_versions), the resumable kind of
        # each target (guards.grad_mode), the cache files of the cache folder (_cache)
        self.versions: dict[str, str | None] = {}
        self.kinds: dict[Any, str] = {}
        self.disk_cache: Any = None

    # -- fork ----------------------------------------------------------------------------

    def before_fork(self) -> None:
        # A child forked while another thread holds a lock, or is half-way through
        # importing structlog for the first event, would wait for ever: fork between those.
        self.logger_lock.acquire(timeout=5)
        self.event_lock.acquire(timeout=5)

    def after_fork_in_parent(self) -> None:
        for lock in (self.event_lock, self.logger_lock):
            if lock.locked():
                try:  # noqa: SIM105 - contextlib costs start-up time
                    lock.release()
                except RuntimeError:  # taken by another thread after the timeout
                    pass

    def after_fork_in_child(self) -> None:
        # A lock held by another thread at fork time would never be released here.
        self.make_locks()
        for guard in self.guards:
            guard._lock = _thread.allocate_lock()


STATE = State()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=STATE.before_fork,
        after_in_parent=STATE.after_fork_in_parent,
        after_in_child=STATE.after_fork_in_child,
    )
