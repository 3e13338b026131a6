"""Start-up cost of autograd-guard, measured side by side in one run.

Builds the wheel, installs it into a fresh venv (and makes a twin venv without it), then
times child interpreters round-robin so that machine noise hits every case alike.
Prints medians and ratios against the goals of the start-up issue.

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
import wheelenv


def timed(cmd: list[str], env: dict[str, str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--torch-runs", type=int, default=12)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ag-bench-"))
    wheel = wheelenv.build_wheel(work / "wheel")
    absent = str(wheelenv.make_env(work / "absent", None))
    installed = str(wheelenv.make_env(work / "installed", wheel))
    cwd = str(work)
    off = wheelenv.clean_environ(XDG_CACHE_HOME=str(work / "cache"))
    on = {**off, "AUTOGRAD_GUARD": "1"}
    subprocess.run([installed, "-c", "pass"], env=on, cwd=cwd, check=True)  # warm caches

    cases: dict[str, tuple[list[str], dict[str, str]]] = {
        "package absent": ([absent, "-c", "pass"], off),
        "installed, variable unset": ([installed, "-c", "pass"], off),
        "installed, variable set, no target": ([installed, "-c", "pass"], on),
    }
    otel = shutil.which("opentelemetry-instrument")
    if otel:
        cases["opentelemetry-instrument python -c pass"] = (
            [otel, sys.executable, "-c", "pass"],
            off,
        )
    startup = run_round_robin(cases, args.runs, cwd)
    torch_cases = {
        "import torch, guard off": ([installed, "-c", "import torch"], off),
        "import torch, guard on": ([installed, "-c", "import torch"], on),
    }
    torch_times = run_round_robin(torch_cases, args.torch_runs, cwd)

    base = startup["package absent"]
    unset = startup["installed, variable unset"]
    setv = startup["installed, variable set, no target"]
    rows = [
        ("package absent", base, 1.0, ""),
        ("installed, variable unset", unset, unset / base, "<= 1.01x"),
        (
            "installed, variable set, no target",
            setv,
            setv / base,
            f"<= +5 ms (measured {setv - base:+.2f} ms)",
        ),
    ]
    if otel:
        value = startup["opentelemetry-instrument python -c pass"]
        rows.append(("opentelemetry-instrument python -c pass", value, value / base, "for scale"))
    else:
        rows.append(
            (
                "opentelemetry-instrument python -c pass",
                float("nan"),
                float("nan"),
                "not installed here",
            )
        )
    t_off, t_on = torch_times["import torch, guard off"], torch_times["import torch, guard on"]
    rows += [
        ("import torch, guard off", t_off, 1.0, ""),
        ("import torch, guard on", t_on, t_on / t_off, "<= 1.02x"),
    ]
    print(
        f"\nstart-up, medians of {args.runs} runs ({args.torch_runs} for torch), "
        f"round-robin, Python {sys.version.split()[0]}"
    )
    print(f"{'case':<42} {'median ms':>10} {'ratio':>8}  goal")
    for name, value, ratio, goal in rows:
        print(f"{name:<42} {value:>10.2f} {ratio:>7.3f}x  {goal}")
    shutil.rmtree(work, ignore_errors=True)


def run_round_robin(
    cases: dict[str, tuple[list[str], dict[str, str]]], runs: int, cwd: str
) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, (cmd, env) in cases.items():
            samples[name].append(timed(cmd, env, cwd))
    return {name: statistics.median(values) for name, values in samples.items()}


if __name__ == "__main__":
    main()
