"""The autograd-guard command: doctor, check, init, run, report."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from autograd_guard._cli import check as _check
from autograd_guard._cli import doctor as _doctor
from autograd_guard._cli import report as _report
from autograd_guard._cli import run as _run
from autograd_guard._common import environment as _environment
from autograd_guard._events import events as _events
from autograd_guard._policy import files as _policy_files
from autograd_guard.guards import available

STARTER = """\
# autograd-guard policy. Every key, option and variable: docs/configuration.md,
# https://github.com/autograd-guard/autograd-guard/blob/main/docs/configuration.md
# Each guard's own options are listed at the end. Check this file: autograd-guard check.
# Every built-in guard is on, in fix mode; change what you need.

# Start from a shipped preset (its name, or a path to a policy file of yours):
{presets}
# extends = "unique3d"

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


DESCRIPTION = "autograd-guard: a run-time guard that keeps gradients correct in PyTorch programs."

# Each command: its one-line summary (the top-level --help) and its description.
COMMANDS = {
    "doctor": (
        "Show what would be guarded here and why.",
        "Python and torch, whether the .pth auto-load is installed and active, the "
        "environment, the policy in force and where it came from, and for each guard its "
        "target version, verdict, mode, symptom and upstream report.",
    ),
    "check": (
        "Validate a policy file and report every problem.",
        "FILE defaults to the policy in force here. Checks every key and value, that each "
        "rule's module can be found (the whole dotted path, without importing anything), "
        "and that the log destination can be written. Prints every problem, each naming "
        "the file, the key and what is allowed; exit status 1 if there is one (a run "
        "ignores each such setting, with a warning, and applies the rest). A rule whose "
        "package is installed but lacks its module is a problem (a typo); one whose "
        "package is not installed here is a warning, as in a run (named at exit), and "
        "fails the check only with --strict.",
    ),
    "init": (
        "Write a commented starter policy to ./autograd_guard.toml.",
        "In the current directory; --force overwrites an existing one. The file checks clean.",
    ),
    "run": (
        "Run a command with the guard on where .pth files are not processed.",
        "Usage: autograd-guard run -- CMD ARGS. For example a 'pip install --target' "
        "folder on PYTHONPATH; child processes are guarded too. A Python command with -S "
        "(which skips the site module, where the guard starts) is refused: exit status 2.",
    ),
    "report": (
        "Summarise a JSON-lines event log.",
        "A log written with AUTOGRAD_GUARD_LOG=FILE: interventions and findings per guard "
        "and call site, across every process that wrote to it.",
    ),
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # The guard's own events (a third-party guard that fails to load, the exit summary)
    # are not a command's output: doctor and check report such problems in words.
    quiet = args.command != "run"
    _events.mute(quiet)
    handler = {
        "doctor": _doctor.doctor,
        "check": _check.check_policy,
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
    finally:
        if quiet:  # nothing of the command's own is left for an exit summary
            _events.mute(False)
            _events.reset(totals=True)


def _parser() -> argparse.ArgumentParser:
    from autograd_guard import __version__

    parser = argparse.ArgumentParser(prog="autograd-guard", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"autograd-guard {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub = {
        name: commands.add_parser(name, help=summary, description=f"{summary} {text}")
        for name, (summary, text) in COMMANDS.items()
    }
    sub["doctor"].add_argument(
        "program", nargs="?", help="a script: the policy its run would find (beside it first)"
    )
    sub["check"].add_argument("file", nargs="?", help="policy file (default: the one in force)")
    sub["check"].add_argument(
        "--strict", action="store_true", help="exit status 1 for a warning too (for CI)"
    )
    sub["init"].add_argument("--force", action="store_true", help="overwrite an existing file")
    sub["run"].add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS")
    _report.add_arguments(sub["report"])
    return parser


def init_policy(args: argparse.Namespace) -> int:
    path = Path(_policy_files.POLICY_FILE)
    if path.exists() and not args.force:
        print(f"{path} exists; use --force to overwrite it", file=sys.stderr)
        return 1
    presets = [
        f"#   {name}: {_policy_files.preset_summary(name)}" for name in _policy_files.preset_names()
    ]
    text = STARTER.format(presets="\n".join(presets)) + _option_reference()
    path.write_text(text, encoding="utf-8")
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
    refusal = _run.refusal(cmd)
    if refusal:
        print(refusal, file=sys.stderr)
        return _run.STOP_STATUS
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
