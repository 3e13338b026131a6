"""``autograd-guard check [FILE]``: every problem of a policy at once, as ruff and mypy
report them: the keys and values, each rule's module (found without importing it), the
log destination, and the variables that change the policy."""

from __future__ import annotations

import os
import sys

from autograd_guard._cli import locate as _locate
from autograd_guard._common import environment as _environment
from autograd_guard._events.actions import plural
from autograd_guard._policy import policy as _policy
from autograd_guard.errors import PolicyError, Problems
from autograd_guard.guards import available

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from autograd_guard._policy.policy import Policy

LOG_ALLOWED = "stderr, logging, or a file path in an existing folder"
NEVER_ATTACHES = "a run cannot attach it and names it at exit (unattached_rules)"


def check_policy(args: argparse.Namespace) -> int:
    """Print every problem and warning (stderr) and note; exit status 1 when there is a
    problem (with ``--strict``, a warning too).

    Warnings are setup facts a run says and runs on: a rule whose package is not
    installed here (the run names it at exit as ``unattached_rules``) and an unknown guard
    in ``AUTOGRAD_GUARD_DISABLE``; problems are mistakes to fix: a key or value the run
    ignores (with a warning, the rest applied), a near miss of a ``log`` keyword, a rule
    whose package is installed but has no such module (a typo)."""
    problems, warnings = Problems(), Problems()
    try:
        policy = _policy.load(args.file, available(), problems=problems)
    except PolicyError as exc:  # the file itself cannot be found, read or parsed
        problems.found.extend(exc.problems)
        policy = None
    notes: list[str] = []
    if policy is not None:
        warnings, notes = survey(policy, problems)
    for note in notes:
        print(f"note: {note}")
    for warning in warnings.found:
        print(f"warning: {warning}", file=sys.stderr)
    for problem in problems.found:  # a variable (AUTOGRAD_GUARD=stirct) is no policy
        label = "setting" if problem.source in _environment.VARIABLES else "policy"
        print(f"invalid {label}: {problem}", file=sys.stderr)
    strict = getattr(args, "strict", False)
    if problems.found or policy is None or (strict and warnings.found):
        return 1
    mode = policy.env_mode or policy.mode
    counted = plural(len(policy.rules), "rule")
    if warnings.found:
        counted += f"; {plural(len(warnings.found), 'warning')}"
    print(f"ok: {policy.source} (mode {mode}, {counted})")
    return 0


def survey(policy: Policy, problems: Problems) -> tuple[Problems, list[str]]:
    """What is wrong with a loaded policy beyond its keys and values (``problems`` gets
    them): each rule's module, the log destination. Returns the warnings (the policy's own
    first) and the notes. ``check`` and ``doctor`` both report through it."""
    warnings = Problems()
    warnings.found.extend(policy.warnings)
    notes = _rule_modules(policy, warnings, problems)
    _log_destination(policy, problems)
    return warnings, notes


def _rule_modules(policy: Policy, warnings: Problems, problems: Problems) -> list[str]:
    """Each rule whose module cannot be found, the whole dotted path resolved without
    importing anything: a problem where its package is installed (a typo of the module,
    with its did-you-mean), else a warning, in the words of the run's ``unattached_rules``
    finding; a rule of a shipped preset (Unique3D's stages) only earns a note, as the run
    leaves those out. Returns the notes."""
    notes = []
    search = [os.getcwd(), *sys.path]  # the program runs from here, not from this script
    for rule in policy.rules:
        why = _locate.why_not_found(rule.module, search)
        if not why:
            continue
        text = f"{why} (for {rule.target!r}): {NEVER_ATTACHES}"
        if rule.origin.startswith("preset "):
            notes.append(f"{rule.origin}: {rule.key}.target: {text}")
        elif _locate.installed(rule.module, search):
            problems.add(rule.origin, f"{rule.key}.target", text)
        else:
            warnings.add(rule.origin, f"{rule.key}.target", text)
    return notes


def _log_destination(policy: Policy, problems: Problems) -> None:
    log = policy.log
    if not log or log in ("stderr", "logging"):
        return
    folder = os.path.dirname(os.path.abspath(log)) or "."
    where = (policy.log_source, "")
    if not os.path.isdir(folder):
        problems.add(*where, f"{log!r}: the folder {folder!r} does not exist", LOG_ALLOWED)
    elif os.path.exists(log) and not os.path.isfile(log):
        problems.add(*where, f"{log!r} is not a regular file", LOG_ALLOWED)
    elif not os.access(log if os.path.exists(log) else folder, os.W_OK):
        problems.add(*where, f"{log!r} cannot be written", "a writable file path")
