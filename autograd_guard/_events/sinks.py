"""Where events go: structlog's processors and the logger at the end of the chain.

Events are rendered by a private processor chain, never the host's structlog or logging
configuration: one readable line on stderr, JSON lines in a file (one ``os.write`` per
line on an ``O_APPEND`` descriptor, so lines from several processes never interleave), or
the ``autograd_guard`` stdlib logger at each event's own level. Imported on the first
event, never at start-up.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import MutableMapping
    from typing import Any

STDERR = "stderr"
LOGGING = "logging"


def make_logger(log: str, source: str) -> Any:
    """A structlog logger writing to ``log`` (``source``: where it was set)."""
    import logging

    import structlog

    sink = _Sink(log, source)
    renderer: Any
    if log == STDERR:
        renderer = _render_line
    elif log == LOGGING:  # the host's logging shows the level itself
        renderer = _render_message
    else:
        sink.json = structlog.processors.JSONRenderer(sort_keys=False)
        renderer = sink.render
    return structlog.wrap_logger(
        sink,
        processors=[
            _describe_arrays,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        cache_logger_on_first_use=False,
    )


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


FIRST_LINE = 200  # the most characters of an event's first line on a terminal
INDENT = "    "
_BREAKS = (": ", "; ", " (", ", ")  # where a long event's first line may end


def _render_line(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> str:
    """Two layers for a person, as ruff and pytest print: a first line of at most
    ``FIRST_LINE`` characters (the level, the guard and action, what happened, where),
    then indented lines (the rest of what happened, the error for an error event, the
    remedy, the policy in force for the run's first event). The other fields (pid,
    process, version, ...) are in the JSON log (``AUTOGRAD_GUARD_LOG=FILE``)."""
    rank = event_dict.get("rank")
    head = f"autograd-guard {event_dict.get('level', 'warning')}"
    head += f" (rank {rank}): [" if rank is not None else ": ["
    head += f"{event_dict.get('guard')}/{event_dict.get('action')}] "
    callsite = _flat(event_dict.get("callsite", "-"))
    where = f" at {callsite}" if callsite != "-" else ""
    if len(head) + len(where) > FIRST_LINE - 40:  # a very long path: its end says most
        where = " at ..." + callsite[-max(FIRST_LINE - 47 - len(head), 20) :]
    first, rest = headline(_flat(event_dict.get("event")), FIRST_LINE - len(head) - len(where))
    lines = [head + first + where]
    for label, key in (
        ("", ""),
        ("error: ", "error"),
        ("remedy: ", "remedy"),
        ("policy: ", "policy"),
    ):
        text = rest if not key else _flat(event_dict.get(key) or "")
        if text:
            lines.append(f"{INDENT}{label}{text}")
    return "\n".join(lines)


def headline(text: str, room: int) -> tuple[str, str]:
    """``text`` cut to at most ``room`` characters where its last clause that fits ends
    (a colon, a semicolon, a parenthesis, a comma; else a space, marked by an ellipsis),
    and the rest."""
    if len(text) <= room:
        return text, ""
    cut, mark, depth = -1, "", 0
    for i, char in enumerate(text[:room]):  # the last clause end outside parentheses
        depth += (char == "(") - (char == ")")
        if depth == 0 and text.startswith(_BREAKS, i) and i >= room // 3:
            cut, mark = i, text[i : i + 2]
    if cut > 0:  # the rest goes below (a parenthesis keeps its opening)
        return text[:cut], text[cut + (1 if mark == " (" else 2) :]
    cut = text.rfind(" ", 0, room - 4)
    cut = cut if cut > 0 else room - 4
    return text[:cut] + " ...", "... " + text[cut:].lstrip()


def _flat(value: Any) -> str:
    """One line of ``value``: the layers are the renderer's own lines."""
    return str(value).replace("\r\n", " ").replace("\n", " ")


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


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\r``, ``\\x1b``, ``\\u202e``):
    a parameter name or a path in an event cannot move the cursor, recolour or rewrite
    the terminal line (a NaN warning displayed as "all gradients healthy")."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _sink_method(level: str) -> Any:
    """One logging method of ``_Sink``: stdlib ``logging`` at that level, or a write."""

    def log(self: _Sink, line: str) -> None:
        if self.log == LOGGING:
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

    def __init__(self, log: str, source: str) -> None:
        self.log = log
        self.source = source
        self.fd: int | None = None
        self.fallback = False
        self.json: Any = None  # the file's renderer

    def render(self, logger: Any, name: str, event_dict: MutableMapping[str, Any]) -> str:
        """A JSON line for the log file; once the file cannot be used, the readable line
        that stderr gets, as if ``log = "stderr"`` had been set."""
        if self.fd is None and not self.fallback:
            self._open()
        if self.fallback:
            return _render_line(logger, name, event_dict)
        return str(self.json(logger, name, event_dict))

    def msg(self, line: str) -> None:
        if self.log != STDERR and not self.fallback:
            line = line.replace("\n", " ")
            fd = self.fd if self.fd is not None else self._open()
            if fd is not None:
                os.write(fd, (line + "\n").encode("utf-8", "replace"))
                return
        # the renderer's own lines (every field's newlines were flattened), each printable
        sys.stderr.write("".join(printable(part) + "\n" for part in line.split("\n")))
        sys.stderr.flush()

    def _open(self) -> int | None:
        import stat

        try:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0)
            fd = os.open(self.log, flags, 0o644)
        except OSError as exc:
            self._give_up(exc.strerror or str(exc))
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            self._give_up("not a regular file")
            return None
        if hasattr(os, "set_blocking"):  # not on every platform
            os.set_blocking(fd, True)
        self.fd = fd
        return fd

    def _give_up(self, why: str) -> None:
        self.fallback = True
        sys.stderr.write(
            f"autograd-guard: cannot write events to {self.log!r} (set by {self.source}): "
            f"{why}; writing them to stderr instead\n"
        )

    debug = _sink_method("debug")
    info = _sink_method("info")
    warning = _sink_method("warning")
    error = _sink_method("error")
    critical = _sink_method("critical")
    warn = warning
