"""``autograd-guard doctor``: what would be guarded here and why."""

from __future__ import annotations

import os
import site
import sys
import sysconfig

from autograd_guard._common import STATE
from autograd_guard._common import environment as _environment
from autograd_guard._common import versions as _versions
from autograd_guard._events.actions import plural
from autograd_guard._policy import policy as _policy
from autograd_guard.errors import PolicyError, Problems
from autograd_guard.guards import available

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from autograd_guard._runtime.guard import Guard

PTH_NAME = "autograd_guard.pth"
RUN_ADVICE = "or run programs with 'autograd-guard run -- CMD ARGS'"


def doctor(args: argparse.Namespace) -> int:
    """Exit status 1 where the policy has a problem (a run ignores it and applies the rest,
    or stops at the import of torch where strict was asked for)."""
    _print_setup()
    guards = available()
    program = _program(getattr(args, "program", None))
    policy, problems = _policy_in_force(guards, program)
    mode = f"{policy.env_mode or policy.mode}"
    print(f"mode          {mode}{' (from AUTOGRAD_GUARD)' if policy.env_mode else ''}")
    print(f"log           {policy.log or 'stderr'}")
    print("guards")
    width = max([len(guard_class.name) for guard_class in guards], default=0)
    for guard_class in guards:
        _print_guard(guard_class, policy, width)
    return 1 if problems else 0


def _program(path: str | None) -> str | None:
    """The folder where a run of the program at ``path`` looks for its policy first."""
    if not path:
        return None
    full = os.path.abspath(path)
    return full if os.path.isdir(full) else os.path.dirname(full)


def _policy_in_force(
    guards: list[type[Guard]], program: str | None
) -> tuple[_policy.Policy, list[PolicyError]]:
    """The policy a run here would use, and its problems, as the auto-load decides
    (``_policy.failure``): printed with where it was found and why."""
    from autograd_guard._cli.check import survey
    from autograd_guard._policy import failure as _policy_failure
    from autograd_guard._policy import files as _policy_files

    problems = Problems()
    try:
        policy = _policy.load(None, guards, os.environ, os.getcwd(), problems, program)
    except PolicyError as exc:
        problems.found.extend(exc.problems)
        default = os.path.join(_policy_files.presets_dir(), "default.toml")
        policy = _policy.load(default, guards, os.environ, os.getcwd(), Problems())
        policy.source, policy.why = "preset default", f"{exc.source} cannot be used"
    loaded = len(problems.found)  # the keys and values: a strict run stops on those
    warnings, notes = survey(policy, problems)  # what check finds, the same way
    print(f"policy        {policy.source}")
    print(f"              {policy.why}")
    found = problems.found
    if found:
        asked = _policy_failure.strict_requested(os.environ, os.getcwd(), program)
        what = "strict: a run stops at its import of torch" if asked and loaded else ""
        what = what or "a run ignores each"
        if len(found) > loaded:  # a rule's module: the run names it at exit
            what += ", or names a rule it cannot attach at exit"
        print(f"  {plural(len(found), 'problem')} ({what}; see 'autograd-guard check'):")
    for problem in found:
        print(f"  invalid: {problem}")
    for warning in warnings.found:
        print(f"  warning: {warning}")
    for note in notes:
        print(f"  note: {note}")
    return policy, found


def _print_setup() -> None:
    from autograd_guard import __version__

    python, torch = sys.version.split()[0], _versions.installed_version("torch")
    print(f"python        {python} ({sys.executable})")
    print(f"torch         {torch or 'not installed'}")
    low, high = _versions.SUPPORTED_TORCH
    print(f"supported     Python {'-'.join(_versions.SUPPORTED_PYTHON)}, torch {low}-{high}")
    note = _versions.support_note(python, torch)
    if note:
        print(f"              {note}")
    print(f"autograd-guard {__version__}")
    pth = find_pth()
    stale = pth and stale_pth(pth)
    if stale:
        print(f".pth          STALE: {pth} imports {stale}, which this version does not have.")
        print(f"              Setting AUTOGRAD_GUARD does nothing here. {stale_pth_advice()}")
    elif pth:
        print(f".pth          installed: {pth}")
    else:
        print(f".pth          MISSING: no {PTH_NAME} in {', '.join(site_dirs())}.")
        print(f"              Setting AUTOGRAD_GUARD does nothing here. {missing_pth_advice()}")
    print(
        f"auto-load     {'active in this process' if STATE.started else 'not active'}"
        f" (AUTOGRAD_GUARD {'requests it' if _environment.requested() else 'is unset or off'})"
    )
    print("environment")
    for name in _environment.VARIABLES:
        print(f"  {name}={os.environ[name]!r}" if name in os.environ else f"  {name} (unset)")


def missing_pth_advice() -> str:
    """What to do about a missing ``.pth``, for the way this copy was installed."""
    import autograd_guard

    folder = os.path.dirname(os.path.dirname(os.path.abspath(autograd_guard.__file__)))
    if _editable():
        return f"An editable install without its .pth: run 'pip install -e .' again, {RUN_ADVICE}."
    if os.path.realpath(folder) not in {os.path.realpath(d) for d in site_dirs()}:
        return (
            f"autograd_guard is imported from {folder}, which is not a site-packages folder "
            "(a 'pip install --target' folder or PYTHONPATH), and Python reads .pth files only "
            f"in those: install it into the environment with pip, {RUN_ADVICE}."
        )
    return f"Reinstall the package (an installer dropped the .pth), {RUN_ADVICE}."


def stale_pth(path: str) -> str | None:
    """A module the installed ``.pth`` imports that this copy of the package lacks: the
    ``.pth`` of an older install, as an editable install keeps across a ``git pull``."""
    import importlib.util
    import re

    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError):
        return None
    for name in re.findall(r"__import__\(\s*[\"']([\w.]+)[\"']", text):
        try:
            if importlib.util.find_spec(name) is None:
                return str(name)
        except (ImportError, ValueError):
            return str(name)
    return None


def stale_pth_advice() -> str:
    if _editable():
        return "An editable install's .pth from an older version: run 'pip install -e .' again."
    return "Reinstall the package (pip install --force-reinstall autograd-guard)."


def _editable() -> bool:
    """Whether pip recorded this distribution as an editable install (PEP 660)."""
    import json
    from importlib import metadata

    try:
        text = metadata.distribution("autograd-guard").read_text("direct_url.json")
        return bool(json.loads(text or "{}").get("dir_info", {}).get("editable"))
    except (metadata.PackageNotFoundError, ValueError, AttributeError):
        return False


def _print_guard(guard_class: type[Guard], policy: _policy.Policy, width: int) -> None:
    """One guard: its mode and verdict, the bug it answers, then its options and docs;
    the name padded to ``width``, the longest guard name's, so the modes line up."""
    name = guard_class.name
    if guard_class.provided_by != "autograd-guard":
        print(f"  {name:<{width}} third-party guard from {guard_class.provided_by}", end="")
        print(f": UNAVAILABLE, {guard_class.unavailable}" if guard_class.unavailable else "")
        if guard_class.unavailable:
            return
    guard = guard_class(policy)
    if guard.rule_action:
        stages = [r.target for r in policy.rules_for(guard.rule_action)]
        why = f"rules: {', '.join(stages)}" if stages else "no rules in the policy: nothing to do"
    else:
        _, why = guard.needed()
    print(f"  {name:<{width}} mode={guard.mode:<7} {why}")
    for label, text in (("symptom", guard.symptom), ("upstream", guard.upstream)):
        if text:
            print(f"      {label:<9} {text}")
    for option, spec in guard.options.items():
        print(f"      {option} = {guard.config[option]!r}  # {spec.doc}")


def site_dirs() -> list[str]:
    dirs = list(getattr(site, "getsitepackages", list)())
    user = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
    dirs += [user] if user else []
    dirs.append(sysconfig.get_paths()["purelib"])
    return list(dict.fromkeys(dirs))


def find_pth() -> str | None:
    for folder in site_dirs():
        candidate = os.path.join(folder, PTH_NAME)
        if os.path.isfile(candidate):
            return candidate
    return None
