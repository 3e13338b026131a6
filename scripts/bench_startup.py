"""Start-up cost of autograd-guard, measured side by side in one run.

Builds the wheel, installs it into a fresh venv (and makes a twin venv without it), then
times child interpreters round-robin so that machine noise hits every case alike.
Prints medians and ratios against the goals of the start-up issue, then, where valgrind
is installed, the same start in instructions (``startup_instructions.py``: callgrind
counts do not move with the machine's load).

    python scripts/bench_startup.py [--runs 40]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import startup_instructions
import wheelenv
from benchtable import Row, print_table


def timed(cmd: list[str], env: dict[str, str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(
        cmd, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return (time.perf_counter() - start) * 1000


def measure(runs: int = 40, torch_runs: int = 12) -> list[Row]:
    work = Path(tempfile.mkdtemp(prefix="ag-bench-"))
    try:
        wheel = wheelenv.build_wheel(work / "wheel")
        absent = str(wheelenv.make_env(work / "absent", None))
        installed = str(wheelenv.make_env(work / "installed", wheel))
        twin = str(wheelenv.make_env(work / "twin", wheel))  # a second environment
        cwd = str(work)
        big = work / "big"  # a project whose policy has 1024 rules
        big.mkdir()
        rules = "".join(
            f'[[rules]]\ntarget = "pkg{i}.mod:stage"\naction = "enable_grad"\n' for i in range(1024)
        )
        (big / "autograd_guard.toml").write_text(rules)
        off = wheelenv.clean_environ(XDG_CACHE_HOME=str(work / "cache"))
        on = {**off, "AUTOGRAD_GUARD": "1"}
        cold = {**on, "AUTOGRAD_GUARD_CACHE": "off"}
        for python, folder in ((installed, cwd), (twin, cwd), (installed, str(big))):
            subprocess.run([python, "-c", "pass"], env=on, cwd=folder, check=True)  # warm
        cases: dict[str, tuple[list[str], dict[str, str], str]] = {
            "absent": ([absent, "-c", "pass"], off, cwd),
            "unset": ([installed, "-c", "pass"], off, cwd),
            "set": ([installed, "-c", "pass"], on, cwd),
            "twin": ([twin, "-c", "pass"], on, cwd),  # alternates with "set"
            "cold": ([installed, "-c", "pass"], cold, cwd),
            "big": ([installed, "-c", "pass"], on, str(big)),
        }
        otel = shutil.which("opentelemetry-instrument")
        if otel:  # no exporters: measure the auto-instrumentation's own start-up
            quiet = {
                **off,
                "OTEL_TRACES_EXPORTER": "none",
                "OTEL_METRICS_EXPORTER": "none",
                "OTEL_LOGS_EXPORTER": "none",
            }
            cases["otel"] = ([otel, absent, "-c", "pass"], quiet, cwd)
        startup = run_round_robin(cases, runs)
        torch_cases = {
            "off": ([installed, "-c", "import torch"], off, cwd),
            "on": ([installed, "-c", "import torch"], on, cwd),
        }
        torch_times = run_round_robin(torch_cases, torch_runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = startup["absent"]
    nan = float("nan")
    five = "<= +5 ms"
    return [
        Row(
            "start-up",
            "installed, variable unset vs package absent",
            base,
            startup["unset"],
            "ms",
            "<= 1.01x",
        ),
        Row(
            "start-up",
            "variable set, no target, warm cache vs absent",
            base,
            startup["set"],
            "ms",
            five,
        ),
        Row(
            "start-up",
            "variable set, two environments alternating vs absent",
            base,
            startup["twin"],
            "ms",
            five,
        ),
        Row(
            "start-up",
            "variable set, 1024-rule policy, warm cache vs absent",
            base,
            startup["big"],
            "ms",
            five,
        ),
        Row(
            "start-up",
            "variable set, cold (AUTOGRAD_GUARD_CACHE=off) vs absent",
            base,
            startup["cold"],
            "ms",
            "quoted",
        ),
        Row(
            "start-up",
            "opentelemetry-instrument python -c pass vs absent",
            base,
            startup.get("otel", nan),
            "ms",
            "for scale" if otel else "not installed here",
        ),
        Row(
            "start-up",
            "import torch, guard on vs off",
            torch_times["off"],
            torch_times["on"],
            "ms",
            "<= 1.02x",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--torch-runs", type=int, default=12)
    args = parser.parse_args()
    print_table(
        measure(args.runs, args.torch_runs),
        f"start-up: medians of {args.runs} runs ({args.torch_runs} for torch), "
        f"round-robin, Python {sys.version.split()[0]}",
    )
    if startup_instructions.available():
        print()
        startup_instructions.main()


def run_round_robin(
    cases: dict[str, tuple[list[str], dict[str, str], str]], runs: int
) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, (cmd, env, cwd) in cases.items():
            samples[name].append(timed(cmd, env, cwd))
    return {name: statistics.median(values) for name, values in samples.items()}


if __name__ == "__main__":
    main()
