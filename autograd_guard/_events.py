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
_counts: dict[tuple[str, str, str], int] = {}
_listeners: list[Listener] = []
_destination = STDERR
_logger: Any = None
_atexit_registered = False


def configure(destination: str | None) -> None:
    """Send events to ``stderr``, ``logging`` or a file path (JSON lines)."""
    global _destination, _logger
    with _lock:
        _destination = destination or STDERR
        _logger = None


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
    }
    rank = os.environ.get("RANK")
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
    global _logger
    import logging

    import structlog

    dest = _destination
    renderer: Any
    if dest in (STDERR, LOGGING):
        renderer = _render_line
    else:
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
    _logger = structlog.wrap_logger(
        _Sink(dest),
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
    """Replace any tensor or array that slipped into an event by its shape and dtype."""
    for key, value in event_dict.items():
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            event_dict[key] = f"<{type(value).__name__} shape={tuple(value.shape)} {value.dtype}>"
    return event_dict


_LINE_KEYS = ("event", "guard", "action", "callsite", "remedy", "level", "timestamp")


def _render_line(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> str:
    extras = " ".join(f"{k}={v}" for k, v in event_dict.items() if k not in _LINE_KEYS)
    line = (
        f"autograd-guard {event_dict.get('level', 'warning')}: [{event_dict.get('guard')}/"
        f"{event_dict.get('action')}] {event_dict.get('event')}"
    )
    if event_dict.get("callsite", "-") != "-":
        line += f" at {event_dict['callsite']}"
    if extras:
        line += f" ({extras})"
    if event_dict.get("remedy"):
        line += f" | remedy: {event_dict['remedy']}"
    return line


class _Sink:
    """The structlog logger: writes each rendered line with one system call."""

    def __init__(self, dest: str) -> None:
        self.dest = dest

    def msg(self, line: str) -> None:
        data = (line.replace("\n", " ") + "\n").encode("utf-8", "replace")
        if self.dest == STDERR:
            sys.stderr.write(data.decode("utf-8"))
            sys.stderr.flush()
        elif self.dest == LOGGING:
            import logging

            logging.getLogger("autograd_guard").warning(line)
        else:
            fd = os.open(self.dest, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

    debug = info = warning = warn = error = critical = exception = msg


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
    total = sum(r["count"] for r in rows)
    try:
        logger = _logger or _make_logger()
        logger.info(
            event=f"summary: {total} interventions at {len(rows)} call sites",
            guard="autograd_guard",
            action="summary",
            callsite="-",
            pid=os.getpid(),
            sites=[f"{r['guard']}/{r['action']} at {r['callsite']} x{r['count']}" for r in rows],
        )
    except Exception:
        pass
