"""The autograd-guard command: doctor, check, init, run, report."""

from __future__ import annotations

import argparse
import json
import os
import site
import sys
import sysconfig
from pathlib import Path

from autograd_guard import _environment, _policy, _policy_files, _report, _versions
from autograd_guard._state import STATE
from autograd_guard.errors import PolicyError
from autograd_guard.guards import available

TYPE_CHECKING = False
if TYPE_CHECKING:
    from autograd_guard._guard import Guard

PTH_NAME = "autograd_guard.pth"

STARTER = """\
# autograd-guard policy. Reference: the README's "Policy" section.
# Start from the shipped default (every built-in guard, fix mode) and change what you need.
extends = "default"

# off | observe (log only) | fix (remedy and log) | strict (raise at the risky call)
mode = "fix"

# Where events go: "stderr", "logging", or a file path for JSON lines.
# log = "autograd_guard.jsonl"

# Switch guards off by name ("*" for all).
# disable = ["warp_torch_args"]

# Per-guard settings: mode, enabled, force (patch whatever the installed version),
# plus the guard's own options.
# [guards.grad_mode]
# mode = "observe"

# Your own pipeline stages that call backward() and so need grad.
# [[rules]]
# target = "my_pipeline.stages:fit_mesh"
# action = "enable_grad"
"""


DESCRIPTION = "autograd-guard: keeps gradients correct in differentiable 3D pipelines."

COMMANDS = {
    "doctor": "Show what would be guarded here and why: Python and torch, whether the .pth "
    "auto-load is installed and active, the environment, the policy in force and where it "
    "came from, and each guard's target version, verdict and mode.",
    "check": "Validate a policy file (default: the one in force here): every key and value, "
    "that each rule's target module can be found (without importing it), and that the log "
    "destination can be written. Exit status 1 names the file, the key and what is allowed.",
    "init": "Write a commented starter policy to ./autograd_guard.toml (in the current "
    "directory; --force overwrites an existing one).",
    "run": "Run a command with the guard on where .pth files are not processed: "
    "autograd-guard run -- CMD ARGS.",
    "report": "Summarise a JSON-lines event log (AUTOGRAD_GUARD_LOG=FILE): interventions per "
    "guard and call site, across every process that wrote to it.",
}


def main(argv: list[str] | None = None) -> int:
    from autograd_guard import __version__

    parser = argparse.ArgumentParser(prog="autograd-guard", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"autograd-guard {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub = {
        name: commands.add_parser(name, help=text.split(":")[0], description=text)
        for name, text in COMMANDS.items()
    }
    sub["check"].add_argument("file", nargs="?", help="policy file (default: the one in force)")
    sub["init"].add_argument("--force", action="store_true", help="overwrite an existing file")
    sub["run"].add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS")
    sub["report"].add_argument("file", help="a JSON-lines event log")
    args = parser.parse_args(argv)
    handler = {
        "doctor": doctor,
        "check": check_policy,
        "init": init_policy,
        "run": run_command,
        "report": _report.report_log,
    }[args.command]
    try:
        return handler(args)
    except BrokenPipeError:  # `autograd-guard doctor | head`: the reader left early
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the exit flush cannot fail again
        return 0


def doctor(_: argparse.Namespace) -> int:
    _print_setup()
    guards = available()
    try:
        policy = _policy.load(None, guards)
    except PolicyError as exc:
        print(f"policy        INVALID: {exc}")
        return 1
    print(f"policy        {policy.source}")
    print(
        f"mode          {policy.env_mode or policy.mode}"
        f"{' (from AUTOGRAD_GUARD)' if policy.env_mode else ''}"
    )
    print(f"log           {policy.log or 'stderr'}")
    print("guards")
    for guard_class in guards:
        _print_guard(guard_class, policy)
    return 0


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
    if pth:
        print(f".pth          installed: {pth}")
    else:
        print(f".pth          MISSING: no {PTH_NAME} in {', '.join(site_dirs())}.")
        print(
            "              Setting AUTOGRAD_GUARD does nothing here. Reinstall without "
            "--editable, or use 'autograd-guard run -- CMD'."
        )
    print(
        f"auto-load     {'active in this process' if STATE.started else 'not active'}"
        f" (AUTOGRAD_GUARD {'requests it' if _environment.requested() else 'is unset or off'})"
    )
    print("environment")
    for name in _environment.VARIABLES:
        print(f"  {name}={os.environ[name]!r}" if name in os.environ else f"  {name} (unset)")


def _print_guard(guard_class: type[Guard], policy: _policy.Policy) -> None:
    """One guard: its mode and the guard's own verdict, then its options and their docs."""
    name = guard_class.name
    if guard_class.provided_by != "autograd-guard":
        print(f"  {name:<18} third-party guard from {guard_class.provided_by}", end="")
        print(f": UNAVAILABLE, {guard_class.unavailable}" if guard_class.unavailable else "")
        if guard_class.unavailable:
            return
    guard = guard_class(policy)
    if guard.distribution:
        _, why = guard.verdict()
    else:
        stages = [r.target for r in policy.rules_for(guard.rule_action)]
        why = f"rules: {', '.join(stages) or 'none'}"
    print(f"  {name:<18} mode={guard.mode:<7} {why}")
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


def check_policy(args: argparse.Namespace) -> int:
    try:
        policy = _policy.load(args.file, available())
    except PolicyError as exc:
        print(f"invalid policy: {exc}", file=sys.stderr)
        return 1
    problems, notes = _unreachable(policy)
    for note in notes:
        print(f"note: {note}")
    if problems:
        for problem in problems:
            print(f"invalid policy: {problem}", file=sys.stderr)
        return 1
    print(f"ok: {policy.source} (mode {policy.env_mode or policy.mode}, {len(policy.rules)} rules)")
    return 0


def _unreachable(policy: _policy.Policy) -> tuple[list[str], list[str]]:
    """Rules whose top-level module cannot be found, and a log that cannot be written.

    Found with ``find_spec`` on the top-level name, which imports nothing. A rule of a
    shipped preset (Unique3D's stages) only earns a note where the program is not there.
    """
    import importlib.machinery
    import importlib.util

    problems: list[str] = []
    notes: list[str] = []
    search = [os.getcwd(), *sys.path]  # the program runs from here, not from this script
    for rule in policy.rules:
        top = rule.module.partition(".")[0]
        if importlib.util.find_spec(top) or importlib.machinery.PathFinder.find_spec(top, search):
            continue
        text = (
            f"{rule.origin}: {rule.key}.target: no module {top!r} can be found here "
            f"for {rule.target!r}"
        )
        (notes if rule.origin.startswith("preset ") else problems).append(text)
    log = policy.log
    if log and log not in ("stderr", "logging"):
        folder = os.path.dirname(os.path.abspath(log)) or "."
        where = f"{policy.log_source}: {log!r}"
        if not os.path.isdir(folder):
            problems.append(
                f"{where}: the folder {folder!r} does not exist "
                "(allowed: stderr, logging, or a file path in an existing folder)"
            )
        elif os.path.exists(log) and not os.path.isfile(log):
            problems.append(
                f"{where}: not a regular file (allowed: stderr, logging, or a file path)"
            )
        elif not os.access(log if os.path.exists(log) else folder, os.W_OK):
            problems.append(f"{where}: not writable (allowed: a writable file path)")
    return problems, notes


def init_policy(args: argparse.Namespace) -> int:
    path = Path(_policy_files.POLICY_FILE)
    if path.exists() and not args.force:
        print(f"{path} exists; use --force to overwrite it", file=sys.stderr)
        return 1
    path.write_text(STARTER + _option_reference(), encoding="utf-8")
    print(f"wrote {path.resolve()}")
    return 0


def _option_reference() -> str:
    """Every guard's own options, commented out, with their defaults and docs."""
    lines = ["", "# Each guard's own options (defaults shown)."]
    for guard in available():
        if guard.options:
            lines.append(f"# [guards.{guard.name}]")
            for name, option in guard.options.items():
                default = json.dumps(option.default)
                lines.append(f"# {name} = {default}  # {option.doc}")
    return "\n".join(lines) + "\n"


def run_command(args: argparse.Namespace) -> int:
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("usage: autograd-guard run -- CMD [ARGS...]", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if not _environment.requested(env):
        env["AUTOGRAD_GUARD"] = "1"
    # Our sitecustomize starts the guard in interpreters that skip .pth files; children
    # inherit PYTHONPATH and the variable, so they are guarded too.
    here = str(Path(__file__).resolve().parent / "_run")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as exc:
        print(f"autograd-guard run: cannot run {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
