"""A policy the auto-load can only partly use, as the user meets it.

Symptom: one typo switched the whole net off. ``mdoe = "fix"`` in the policy, or
``AUTOGRAD_GUARD=fxi`` (``ture``, ``obsreve``), ran the program fully unguarded after one
start-up line that scrolled away, and the NaN example ended with non-finite weights; a
typo in ``AUTOGRAD_GUARD_DISABLE`` did the opposite (it warned and kept the guard on).
Strict with an unusable policy stopped every Python program at start, pip and the
user's other tools included.

Affected: every version before this module's remedy (0.1.0).

Remedy: what the guard can use of a policy is used. An unknown key or a bad value (in
the policy or a variable) is ignored with its warning and did-you-mean, and the rest
applies: a near miss of a mode in ``AUTOGRAD_GUARD`` runs in the policy's modes, an
unknown guard in ``AUTOGRAD_GUARD_DISABLE`` leaves the guards on. A policy file that
cannot be read (invalid TOML, a missing file) gives way to the shipped ``default``
preset. Either way one headline and one line per problem are said at start, and said
again at exit, so that they do not scroll away. Where strict was asked for (in so many
words or by a near miss whose did-you-mean reads as strict: ``AUTOGRAD_GUARD``,
``AUTOGRAD_GUARD_POLICY``, the policy's ``mode``, a guard's ``mode``, ``extends``), a
problem stops the program at its import of torch, with one message and exit status 2;
a program that never imports torch (pip, the user's other tools) runs on, so that the
policy can be fixed or the package uninstalled. ``os._exit`` ends it: inside ``site``
(torch imported by a ``sitecustomize``) an exception other than ``Exception`` ends the
interpreter with "Fatal Python error: init_import_site". The ``autograd-guard`` command
itself is never stopped and prints nothing here: ``check`` and ``doctor`` report.
"""

from __future__ import annotations

import os
import sys

from autograd_guard._common import STATE
from autograd_guard._common import environment as _environment
from autograd_guard._events import events as _events
from autograd_guard._events.actions import plural
from autograd_guard._events.sinks import printable
from autograd_guard._policy import files as _policy_files
from autograd_guard._policy import policy as _policy
from autograd_guard.errors import PolicyError, PolicyErrors, Problems, closest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any, NoReturn

    from autograd_guard._policy.options import GuardOptions
    from autograd_guard._policy.policy import Policy

STOP_STATUS = 2  # a setup error, as argparse's; a strict finding at exit is 3
STRICT = "strict"
LISTS_THEM = "'autograd-guard check' lists them"


def autoload(environ: Mapping[str, str], guards: Iterable[type[GuardOptions]]) -> Policy | None:
    """The policy a start uses, its problems made warnings (``install`` prints them after
    the headline said here); None where strict was asked for and there is a problem (the
    program is then stopped at its import of torch)."""
    guard_list, cwd, program = list(guards), os.getcwd(), _policy_files.program_folder()
    problems = Problems()
    try:
        policy: Policy | None = _policy.load(None, guard_list, environ, cwd, problems, program)
        found = problems.found
    except PolicyError as exc:  # the file cannot be found, read or parsed
        policy, found = None, exc.problems
    asked = strict_requested(environ, cwd, program) if found else ""
    if asked:
        STATE.error = str(PolicyErrors(found))
        _stop_at_torch(stop_lines(found, asked))
        return None
    headline = partial_headline(found) if found else ""
    if policy is None:
        more = Problems()
        policy = _default_preset(guard_list, environ, cwd, more)
        headline = fallback_headline(found, more.found)
        policy.why = f"{found[0].source} cannot be used: the shipped default instead"
        found = [*found, *more.found]
    policy.warnings[:0] = found
    if headline and not STATE.muted:
        _write([headline])
    if policy.warnings:
        lines = [headline] if headline else []
        _repeat_at_exit([*lines, *(f"autograd-guard: {w}" for w in policy.warnings)])
    return policy


def _default_preset(
    guards: list[type[GuardOptions]], environ: Mapping[str, str], cwd: str, problems: Problems
) -> Policy:
    """The shipped ``default`` preset, with the variables' overrides."""
    path = os.path.join(_policy_files.presets_dir(), "default.toml")
    policy = _policy.load(path, guards, environ, cwd, problems)
    policy.source = "preset default"
    return policy


def partial_headline(found: list[PolicyError]) -> str:
    count = plural(len(found), "setting")
    return (
        f"autograd-guard: {subject(found)}: {count} ignored, the rest applies "
        f"and the guard is on ({LISTS_THEM}):"
    )


def fallback_headline(unreadable: list[PolicyError], more: list[PolicyError]) -> str:
    count = plural(len(unreadable) + len(more), "problem")
    source = unreadable[0].source
    named = f"named by {source}" if source in _environment.VARIABLES else source
    return (
        f"autograd-guard: cannot use the policy {named}; running the shipped "
        f"default preset instead ({count}; {LISTS_THEM}):"
    )


def stop_lines(found: list[PolicyError], asked: str) -> list[str]:
    count = plural(len(found), "problem")
    headline = (
        f"autograd-guard: {subject(found)} in strict mode ({asked}): stopped at the import "
        f"of torch, exit status {STOP_STATUS} ({count} to fix; or unset AUTOGRAD_GUARD):"
    )
    return [headline, *problem_lines(found)]


def subject(found: list[PolicyError]) -> str:
    """What is invalid, as the user set it: the policy, a variable (``AUTOGRAD_GUARD=stirct``
    is no policy), or both."""
    named = {problem.source for problem in found}
    variables = [name for name in _environment.VARIABLES if name in named]
    if not variables:
        return "invalid policy"
    setting = f"invalid {' and '.join(variables)} value{'s' if len(variables) > 1 else ''}"
    return setting if len(variables) == len(named) else f"invalid policy and {setting[8:]}"


def problem_lines(found: list[PolicyError]) -> list[str]:
    return [f"  {problem}" for problem in found]


def _repeat_at_exit(lines: list[str]) -> None:
    """Say the start's warnings again at exit, with the summary: they scroll away."""
    if STATE.muted:  # the autograd-guard command: its own report names the problems
        return

    def again() -> None:
        if not STATE.muted:
            _write(["autograd-guard: said at start:", *(f"  {line}" for line in lines)])

    _events.at_exit(again)


def _write(lines: list[str]) -> None:
    try:  # noqa: SIM105 - a path in the policy may hold any character (escaped)
        sys.stderr.write("".join(printable(line) + "\n" for line in lines))
    except Exception:
        pass


def _stop_at_torch(lines: list[str]) -> None:
    """Stop the program where it imports torch (now, if it has already)."""
    if STATE.muted:
        return
    if "torch" in sys.modules:
        _stop(lines)
    sys.meta_path.insert(0, _StopAtTorch(lines))


class _StopAtTorch:
    """A finder that ends the process at the first import of torch."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torch" or name.startswith("torch."):
            _stop(self.lines)

    def invalidate_caches(self) -> None:
        pass


def _stop(lines: list[str]) -> NoReturn:
    _write(lines)
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - contextlib costs start-up time
            stream.flush()
        except Exception:
            pass
    os._exit(STOP_STATUS)


def strict_requested(environ: Mapping[str, str], cwd: str, program: str | None = None) -> str:
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
        found = _policy_files.discover(environ, cwd, None, program)
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
