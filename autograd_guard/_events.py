"""Structured events: one per (guard, action, call site), repeats counted, a summary at exit.

structlog is imported on the first event, never at start-up. The host's structlog and
``logging`` configuration is left alone: events go through a private processor chain to
stderr (one readable line), a JSON-lines file (one ``os.write`` per line on an
``O_APPEND`` descriptor, so lines from several processes never interleave), or, with
``AUTOGRAD_GUARD_LOG=logging``, the ``autograd_guard`` stdlib logger.
"""

from __future__ import annotations

import _thread
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, MutableMapping
    from typing import Any

    Listener = Callable[[dict[str, Any]], None]

STDERR = "stderr"
LOGGING = "logging"

_lock = _thread.allocate_lock()
_logger_lock = _thread.allocate_lock()  # held while the logger (and structlog) is made
_counts: dict[tuple[str, str, str], int] = {}
_listeners: list[Listener] = []
_destination = STDERR
_destination_source = "default"
_logger: Any = None
_atexit_registered = False


def configure(destination: str | None, source: str = "AUTOGRAD_GUARD_LOG") -> None:
    """Send events to ``stderr``, ``logging`` or a file path (JSON lines); ``source`` says
    where that was set, for the message if the file cannot be written."""
    global _destination, _destination_source, _logger
    with _lock:
        _destination = destination or STDERR
        _destination_source = source if destination else "default"
        _logger = None


def _before_fork() -> None:
    # A child forked while another thread holds a lock, or is half-way through importing
    # structlog for the first event, would wait for ever: fork only between those.
    _logger_lock.acquire(timeout=5)
    _lock.acquire(timeout=5)


def _after_fork_in_parent() -> None:
    for lock in (_lock, _logger_lock):
        if lock.locked():
            try:  # noqa: SIM105 - contextlib costs start-up time
                lock.release()
            except RuntimeError:  # taken by another thread after the timeout
                pass


def _after_fork_in_child() -> None:
    global _lock, _logger_lock
    _lock = _thread.allocate_lock()
    _logger_lock = _thread.allocate_lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )


def destination() -> str:
    return _destination


def reset() -> None:
    """Forget which call sites were seen (a fresh ``install``)."""
    with _lock:
        _counts.clear()


def counts() -> dict[tuple[str, str, str], int]:
    with _lock:
        return dict(_counts)


def add_listener(listener: Listener) -> None:
    with _lock:
        _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


# Events that report no intervention: setup notes, the guard's own errors, the summary.
NOT_INTERVENTIONS = frozenset(
    {
        "guard_error",
        "load_error",
        "bad_target",
        "late_patch",
        "disabled",
        "over_byte_limit",
        "copy_back",
        "compiled_unguarded",
        "scripted_unguarded",
        "summary",
    }
)

_process: tuple[int, str] | None = None


def process_id() -> str:
    """Tells processes apart in a shared log even where PIDs repeat (containers, PID
    namespaces): the PID and the process's first-event time, made anew after a fork."""
    global _process
    pid = os.getpid()
    if _process is None or _process[0] != pid:
        import time

        _process = (pid, f"{pid}-{time.time_ns():x}")
    return _process[1]


def emit(
    event: str, *, guard: str, action: str, callsite: str, level: str = "warning", **fields: Any
) -> bool:
    """Log ``event`` the first time (guard, action, callsite) is seen; count it every time.

    Returns True when the event was logged. Never raises.
    """
    key = (guard, action, callsite)
    with _lock:
        seen = _counts.get(key, 0)
        _counts[key] = seen + 1
        listeners = list(_listeners)
    if seen:
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
    from autograd_guard._environment import rank as current_rank

    rank = current_rank()
    if rank is not None:
        record["rank"] = rank
    record.update((k, v) for k, v in fields.items() if v is not None)
    _deliver(level, record, listeners)
    return True


def _deliver(level: str, record: dict[str, Any], listeners: list[Listener]) -> None:
    try:
        _register_summary()
        for listener in listeners:
            listener(dict(record))
        logger = _logger or _make_logger()
        getattr(logger, level)(**record)
    except Exception as exc:
        try:  # noqa: SIM105 - contextlib costs start-up time
            sys.stderr.write(f"autograd-guard: could not log an event: {exc!r}\n")
        except Exception:
            pass


def _make_logger() -> Any:
    with _logger_lock:
        return _logger or _new_logger()


def _new_logger() -> Any:
    global _logger
    import logging

    import structlog

    dest = _destination
    renderer: Any
    if dest == STDERR:
        renderer = _render_line
    elif dest == LOGGING:  # the host's logging shows the level itself
        renderer = _render_message
    else:
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
    _logger = structlog.wrap_logger(
        _Sink(dest, _destination_source),
        processors=[
            _describe_arrays,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        cache_logger_on_first_use=False,
    )
    return _logger


def _describe_arrays(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    """Replace any tensor or array that slipped into an event, at any depth, by its shape
    and dtype: no tensor data ever reaches a log."""
    for key, value in event_dict.items():
        event_dict[key] = _without_arrays(value, 0)
    return event_dict


def _without_arrays(value: Any, depth: int) -> Any:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"<{type(value).__name__} shape={tuple(value.shape)} {value.dtype}>"
    if depth >= 8:
        return value if isinstance(value, (str, int, float, bool, type(None))) else "<...>"
    if isinstance(value, dict):
        return {k: _without_arrays(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_without_arrays(v, depth + 1) for v in value]
    return value


_LINE_KEYS = ("event", "guard", "action", "callsite", "remedy", "level", "timestamp")


def _render_line(logger: Any, name: str, event_dict: MutableMapping[str, Any]) -> str:
    level = event_dict.get("level", "warning")
    return f"autograd-guard {level}: {_render_message(logger, name, event_dict)}"


def _render_message(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> str:
    extras = " ".join(f"{k}={v}" for k, v in event_dict.items() if k not in _LINE_KEYS)
    line = f"[{event_dict.get('guard')}/{event_dict.get('action')}] {event_dict.get('event')}"
    if event_dict.get("callsite", "-") != "-":
        line += f" at {event_dict['callsite']}"
    if extras:
        line += f" ({extras})"
    if event_dict.get("remedy"):
        line += f" | remedy: {event_dict['remedy']}"
    return line


def _sink_method(level: str) -> Any:
    """One logging method of ``_Sink``: stdlib ``logging`` at that level, or a write."""

    def log(self: _Sink, line: str) -> None:
        if self.dest == LOGGING:
            import logging

            logging.getLogger("autograd_guard").log(getattr(logging, level.upper()), line)
        else:
            self.msg(line)

    return log


class _Sink:
    """The structlog logger: writes each rendered line with one system call.

    A log file is opened once, without blocking (a FIFO with no reader must not hang the
    program), and must be a regular file; when it cannot be used the events go to stderr
    after one line naming the path and where it was set.
    """

    def __init__(self, dest: str, source: str) -> None:
        self.dest = dest
        self.source = source
        self.fd: int | None = None
        self.fallback = False

    def msg(self, line: str) -> None:
        data = (line.replace("\n", " ") + "\n").encode("utf-8", "replace")
        if self.dest != STDERR and not self.fallback:
            fd = self.fd if self.fd is not None else self._open()
            if fd is not None:
                os.write(fd, data)
                return
        sys.stderr.write(data.decode("utf-8"))
        sys.stderr.flush()

    def _open(self) -> int | None:
        import stat

        try:
            fd = os.open(self.dest, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            self._give_up(exc.strerror or str(exc))
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            self._give_up("not a regular file")
            return None
        os.set_blocking(fd, True)
        self.fd = fd
        return fd

    def _give_up(self, why: str) -> None:
        self.fallback = True
        sys.stderr.write(
            f"autograd-guard: cannot write events to {self.dest!r} (set by {self.source}): "
            f"{why}; writing them to stderr instead\n"
        )

    debug = _sink_method("debug")
    info = _sink_method("info")
    warning = _sink_method("warning")
    error = _sink_method("error")
    critical = _sink_method("critical")
    warn = warning


def _register_summary() -> None:
    global _atexit_registered
    if not _atexit_registered:
        _atexit_registered = True
        import atexit

        atexit.register(_summary_at_exit)


def summary() -> list[dict[str, Any]]:
    return [
        {"guard": g, "action": a, "callsite": c, "count": n}
        for (g, a, c), n in sorted(counts().items())
    ]


def _summary_at_exit() -> None:
    rows = summary()
    if not rows:
        return
    try:
        logger = _logger or _make_logger()
        logger.info(
            event=f"summary: {describe_counts(rows)}",
            guard="autograd_guard",
            action="summary",
            callsite="-",
            pid=os.getpid(),
            process=process_id(),
            sites=[f"{r['guard']}/{r['action']} at {r['callsite']} x{r['count']}" for r in rows],
        )
    except Exception:
        pass


def describe_counts(rows: list[dict[str, Any]]) -> str:
    """ "3 interventions at 2 call sites; 1 other event" (errors and notes apart)."""
    done = [r for r in rows if r["action"] not in NOT_INTERVENTIONS]
    other = sum(r["count"] for r in rows if r["action"] in NOT_INTERVENTIONS)
    text = (
        f"{plural(sum(r['count'] for r in done), 'intervention')} at "
        f"{plural(len({(r['guard'], r['callsite']) for r in done}), 'call site')}"
    )
    return text + (f"; {plural(other, 'other event')} (notes and errors)" if other else "")


def plural(count: int, noun: str) -> str:
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {noun}es" if noun.endswith("s") else f"{count} {noun}s"
