"""Structured events: one per (guard, action, call site), repeats counted, a summary at exit.

structlog is imported on the first event, never at start-up (see ``_events.sinks``). The host's
structlog and ``logging`` configuration is left alone.
"""

from __future__ import annotations

import os
import sys
import threading

from autograd_guard._common import STATE
from autograd_guard._events.sinks import STDERR

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Listener = Callable[[dict[str, Any]], None]


def configure(log: str | None, source: str = "AUTOGRAD_GUARD_LOG") -> None:
    """Send events to ``stderr``, ``logging`` or a file path (JSON lines); ``source`` says
    where that was set, for the message if the file cannot be written."""
    with STATE.event_lock:
        STATE.log = log or STDERR
        STATE.log_source = source if log else "default"
        STATE.logger = None


_FIRST: dict[str, Any] = {}  # fields for the process's first event shown (see in_first_event)


def in_first_event(**fields: Any) -> None:
    """Add ``fields`` to the next event shown, the run's first (the policy in force and
    why), so that a run says it where something happens, and only there."""
    with STATE.event_lock:
        _FIRST.clear()
        _FIRST.update(fields)


def mute(muted: bool = True) -> None:
    """Count events but show none, nor the exit summary: for the command line's own
    commands, whose output is their report (``doctor`` names a broken guard in words)."""
    with STATE.event_lock:
        STATE.muted = muted


_UNHEARD = threading.local()  # a guard's own re-run of the user's code runs on this thread


def unheard(on: bool) -> None:
    """While on, events of this thread are neither shown nor counted: what other guards say
    of a guard's own re-run of the user's code (grad_audit's) is not the user's run."""
    _UNHEARD.on = on


def after_summary(say: Callable[[], None]) -> None:
    """Run ``say`` once at exit, after the summary (a last line of its own)."""
    with STATE.event_lock:
        if say not in _AFTER:
            _AFTER.append(say)
    _register_summary()


_AFTER: list[Callable[[], None]] = []


def at_exit(check: Callable[[], None]) -> None:
    """Run ``check`` once at exit, before the summary, so that what it logs is counted."""
    with STATE.event_lock:
        if check not in STATE.exit_checks:
            STATE.exit_checks.append(check)
    _register_summary()


def fail_at_exit(status: int) -> None:
    """strict: the process ends with ``status`` (an exception raised at exit would not
    change it): set once the summary has been logged, as the last exit handler of ours."""
    STATE.exit_status, STATE.exit_pid = status, os.getpid()  # not a fork's
    _register_summary()


def reset(totals: bool = False) -> None:
    """Forget which call sites were seen (a fresh ``install``, a test's capture): each is
    logged again. The process's totals, which the exit summary counts, are kept unless
    ``totals`` (a command of the command line leaves none of its own)."""
    with STATE.event_lock:
        STATE.counts.clear()
        _FIRST.clear()
        if totals:
            STATE.totals.clear()


def counts() -> dict[tuple[str, str, str], int]:
    """Every event of the process, counted by (guard, action, call site)."""
    with STATE.event_lock:
        return dict(STATE.totals)


def add_listener(listener: Listener) -> None:
    with STATE.event_lock:
        STATE.listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    with STATE.event_lock:
        if listener in STATE.listeners:
            STATE.listeners.remove(listener)


def process_id() -> str:
    """Tells processes apart in a shared log even where PIDs repeat (containers, PID
    namespaces): the PID and the process's first-event time, made anew after a fork."""
    pid = os.getpid()
    if STATE.process is None or STATE.process[0] != pid:
        import time

        STATE.process = (pid, f"{pid}-{time.time_ns():x}")
    return STATE.process[1]


def emit(
    event: str,
    *,
    guard: str,
    action: str,
    callsite: str,
    level: str = "warning",
    always: bool = False,
    **fields: Any,
) -> bool:
    """Log ``event`` the first time (guard, action, callsite) is seen (every time with
    ``always``, for an event its guard repeats at a bounded rate); count it every time.

    Returns True when the event was logged. Never raises.
    """
    if getattr(_UNHEARD, "on", False):
        return False
    key = (guard, action, callsite)
    with STATE.event_lock:
        seen = STATE.counts.get(key, 0)
        STATE.counts[key] = seen + 1
        STATE.totals[key] = STATE.totals.get(key, 0) + 1
        listeners = list(STATE.listeners)
        first = {} if (seen and not always) or STATE.muted else dict(_FIRST)
        if first:
            _FIRST.clear()
    if (seen and not always) or STATE.muted:
        return False
    record: dict[str, Any] = {
        "event": event,
        "guard": guard,
        "action": action,
        "callsite": callsite,
        "level": level,
        "pid": os.getpid(),
        "process": process_id(),
    }
    from autograd_guard._common.environment import rank as current_rank

    rank = current_rank()
    if rank is not None:
        record["rank"] = rank
    record.update((k, v) for k, v in fields.items() if v is not None)
    record.update(first)
    _deliver(level, record, listeners)
    return True


def _deliver(level: str, record: dict[str, Any], listeners: list[Listener]) -> None:
    try:
        _register_summary()
        for listener in listeners:
            listener(dict(record))
        getattr(_logger(), level)(**record)
    except Exception as exc:
        try:  # noqa: SIM105 - contextlib costs start-up time
            sys.stderr.write(f"autograd-guard: could not log an event: {type(exc).__name__}\n")
        except Exception:
            pass


def _logger() -> Any:
    logger = STATE.logger
    if logger is None:
        with STATE.logger_lock:  # a fork waits for this (see _common.State)
            if STATE.logger is None:
                from autograd_guard._events.sinks import make_logger

                STATE.logger = make_logger(STATE.log, STATE.log_source)
            logger = STATE.logger
    return logger


def _register_summary() -> None:
    if not STATE.summary_registered:
        STATE.summary_registered = True
        import atexit

        atexit.register(_summary_at_exit)


def summary() -> list[dict[str, Any]]:
    return [
        {"guard": g, "action": a, "callsite": c, "count": n}
        for (g, a, c), n in sorted(counts().items())
    ]


def _summary_at_exit() -> None:
    for check in list(STATE.exit_checks):
        try:  # noqa: SIM105 - contextlib costs start-up time
            check()
        except Exception:
            pass
    _log_summary()
    for say in list(_AFTER):
        try:  # noqa: SIM105 - contextlib costs start-up time
            say()
        except Exception:
            pass
    _exit_with_status()


def _log_summary() -> None:
    rows = summary()
    if not rows:
        return
    try:
        from autograd_guard._common.environment import rank
        from autograd_guard._events.actions import describe_counts  # what each action means

        fields = {"rank": rank()}
        _logger().info(
            event=f"summary: {describe_counts(rows)}",
            guard="autograd_guard",
            action="summary",
            callsite="-",
            pid=os.getpid(),
            process=process_id(),
            **{k: v for k, v in fields.items() if v is not None},
            sites=[f"{r['guard']}/{r['action']} at {r['callsite']} x{r['count']}" for r in rows],
        )
    except Exception:
        pass


def _exit_with_status() -> None:
    """strict with a finding: end with a non-zero status. The summary's handler is
    registered at install (under the ``.pth``, at interpreter start), so the program's
    own exit handlers have run; what ``os._exit`` would skip is done first: logging is
    shut down and every open file flushed. A program that failed already keeps its own
    status (an uncaught exception's 1)."""
    status = STATE.exit_status
    if not status or os.getpid() != STATE.exit_pid:
        return
    failed = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    try:
        sys.stderr.write(
            "autograd-guard: strict: the run ended with a finding (above)"
            + ("\n" if failed else f"; exit status {status}\n")
        )
        if failed:
            return
        _flush_everything()
    except Exception:
        pass
    os._exit(status)


def _flush_everything() -> None:
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.shutdown()
    import gc
    import io

    for obj in gc.get_objects():
        if issubclass(type(obj), io.IOBase) and not obj.closed:  # never a proxy's __class__
            try:
                if obj.writable():
                    obj.flush()
            except Exception:
                pass
