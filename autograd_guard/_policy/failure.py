"""A policy the auto-load cannot use, as the user meets it.

Symptom: ``AUTOGRAD_GUARD=stirct`` (or ``mode = "strcit"`` in the policy) ran the program
unguarded with exit status 0, although the message knew that strict was meant ("did you
mean 'strict'?"); every problem of the policy came on one joined line (~1,900 characters
for a few typos), printed twice where strict was asked for.

Affected: every version before this module (0.1.0).

Remedy: where strict was asked for, in so many words or by a near miss that the
did-you-mean reads as strict (``AUTOGRAD_GUARD``, ``AUTOGRAD_GUARD_POLICY``, the policy's
``mode``, a guard's ``mode``, ``extends``), the process stops before the program runs:
one headline, one line per problem, exit status 2. It cannot raise ``SystemExit``: a
``.pth`` line runs inside ``site``, where an exception other than ``Exception`` ends the
interpreter with "Fatal Python error: init_import_site" and a traceback (CPython
3.10-3.13), so the streams are flushed and ``os._exit`` ends it. Otherwise the program
runs unguarded after the same headline and lines, printed once (and the ``disabled``
event goes to a log file or ``logging`` where one is set). The ``autograd-guard``
command itself is never stopped and prints nothing here: ``check`` and ``doctor`` report
the problems, and ``check`` is how they get fixed.
"""

from __future__ import annotations

import os
import sys

from autograd_guard._common import STATE
from autograd_guard._common import environment as _environment
from autograd_guard._events import events as _events
from autograd_guard._events.actions import plural
from autograd_guard._events.sinks import STDERR, printable
from autograd_guard._policy import files as _policy_files
from autograd_guard.errors import PolicyError, closest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, NoReturn

STOP_STATUS = 2  # a setup error, as argparse's; a strict finding at exit is 3
REMEDY = "Run 'autograd-guard check' and fix the key it names."
STRICT = "strict"


def unusable(error: PolicyError, environ: Mapping[str, str]) -> None:
    """The auto-load could not use the policy: stop where strict was asked for, else run
    unguarded; either way the problems are said once, one line each."""
    STATE.error = str(error)
    if STATE.muted:  # the autograd-guard command: its own report names the problems
        return
    asked = strict_requested(environ, os.getcwd())
    if asked:
        _write(stop_lines(error, asked))
        _stop()
    _write(unguarded_lines(error))
    _log_event(error, environ)


def unguarded_lines(error: PolicyError) -> list[str]:
    count = plural(len(error.problems), "problem")
    headline = (
        f"autograd-guard: {subject(error)}; running unguarded ({count} to fix; "
        "'autograd-guard check' lists them):"
    )
    return [headline, *problem_lines(error)]


def stop_lines(error: PolicyError, asked: str) -> list[str]:
    count = plural(len(error.problems), "problem")
    headline = (
        f"autograd-guard: {subject(error)} in strict mode ({asked}): stopped before the "
        f"program ran, exit status {STOP_STATUS} ({count} to fix; or unset AUTOGRAD_GUARD):"
    )
    return [headline, *problem_lines(error)]


def subject(error: PolicyError) -> str:
    """What is invalid, as the user set it: the policy, a variable (``AUTOGRAD_GUARD=stirct``
    is no policy), or both."""
    named = {problem.source for problem in error.problems}
    variables = [name for name in _environment.VARIABLES if name in named]
    if not variables:
        return "invalid policy"
    setting = f"invalid {' and '.join(variables)} value{'s' if len(variables) > 1 else ''}"
    return setting if len(variables) == len(named) else f"invalid policy and {setting[8:]}"


def problem_lines(error: PolicyError) -> list[str]:
    return [f"  {problem}" for problem in error.problems]


def _write(lines: list[str]) -> None:
    try:  # noqa: SIM105 - a path in the policy may hold any character (escaped)
        sys.stderr.write("".join(printable(line) + "\n" for line in lines))
    except Exception:
        pass


def _stop() -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - contextlib costs start-up time
            stream.flush()
        except Exception:
            pass
    os._exit(STOP_STATUS)


def _log_event(error: PolicyError, environ: Mapping[str, str]) -> None:
    """The ``disabled`` event, for a log file or ``logging``; on stderr the lines above
    are that event, so nothing more is said there (nor an exit summary of it)."""
    _events.configure(_environment.log(environ))
    if STATE.log == STDERR:
        return
    _events.emit(
        f"{subject(error)}; running unguarded",
        guard="autograd_guard",
        action="disabled",
        callsite=error.source,
        level="error",
        error=str(error),
        problems=[str(problem) for problem in error.problems],
        remedy=REMEDY,
    )


def strict_requested(environ: Mapping[str, str], cwd: str) -> str:
    """Where strict was asked for, in words ("" where it was not): ``AUTOGRAD_GUARD``
    (which overrides every mode of the policy), ``AUTOGRAD_GUARD_POLICY``, or a ``mode``
    in the policy or a file it extends; a near miss counts where the did-you-mean of
    its message says strict."""
    raw = environ.get(_environment.AUTOGRAD_GUARD, "").strip()
    meant = closest(raw, [*_environment.MODES, *sorted(_environment.ON_VALUES)])
    if meant in _environment.MODES:
        return f"{_environment.AUTOGRAD_GUARD}={raw}" if meant == STRICT else ""
    named = _environment.policy_name(environ)
    if named and _is_strict_preset(named, cwd):
        return f"{_environment.AUTOGRAD_GUARD_POLICY}={named}"
    try:
        found = _policy_files.discover(environ, cwd)
    except PolicyError:
        return ""
    return _strict_in_file(found, 0, mode_set=False)


def _is_strict_preset(named: str, relative_to: str | None) -> bool:
    try:
        _policy_files.resolve_named(named, "", relative_to)
    except PolicyError as exc:
        return exc.suggestion == STRICT
    return False  # a file (read below) or another preset


def _strict_in_file(found: _policy_files.Discovered, depth: int, mode_set: bool) -> str:
    """strict in this file's ``mode`` (unless a file extending it set its own), in a
    guard's ``mode``, or in what it extends."""
    try:
        data = found.read()
    except PolicyError:  # not TOML at all: its lines that set a mode
        return _strict_line(found)
    where = f"in {found.description}"
    modes: list[tuple[str, Any]] = [] if mode_set else [("mode", data.get("mode"))]
    guards = data.get("guards")
    for name, table in (guards if isinstance(guards, dict) else {}).items():
        if isinstance(table, dict):
            modes.append((f"guards.{name}.mode", table.get("mode")))
    for key, value in modes:
        if isinstance(value, str) and closest(value, _environment.MODES) == STRICT:
            return f"{key} = {value!r} {where}"
    extends = data.get("extends")
    if not isinstance(extends, str) or depth >= 8:
        return ""
    folder = os.path.dirname(found.path)
    if _is_strict_preset(extends, folder):
        return f"extends = {extends!r} {where}"
    try:
        base = _policy_files.resolve_named(extends, "extends", folder)
    except PolicyError:
        return ""
    return _strict_in_file(base, depth + 1, mode_set or "mode" in data)


def _strict_line(found: _policy_files.Discovered) -> str:
    """A file that does not parse: a ``mode = "..."`` line (``[tool.autograd_guard]``'s
    lines only, in a pyproject.toml) that says strict or nearly."""
    try:
        with open(found.path, "rb") as f:
            text = f.read(_policy_files.MAX_POLICY_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""
    inside = not found.is_pyproject
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("[") and found.is_pyproject:
            inside = stripped.lstrip("[").startswith("tool.autograd_guard")
        key, equals, value = stripped.partition("=")
        if not (inside and equals and key.strip().rpartition(".")[2] == "mode"):
            continue
        word = value.partition("#")[0].strip().strip("\"'")
        if closest(word, _environment.MODES) == STRICT:
            return f"mode = {word!r} on line {number} of {found.description}"
    return ""
