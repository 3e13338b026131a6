"""Every benchmark side by side in one run, printed as one table of ratios.

    python scripts/bench_all.py [--quick]

Start-up (package absent, variable unset and set, opentelemetry-instrument, import torch),
the per-call overhead of each guard's wrapper on its pass-through path, snapshot rules,
Taubin smoothing ours vs PyTorch3D's, Warp's launch wrapped vs bare, and grad_health's
per-step cost.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_grad_health
import bench_overhead
import bench_startup
import bench_taubin
import bench_warp
from benchtable import print_table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer runs; smaller meshes")
    args = parser.parse_args()
    quick = args.quick
    rows = bench_startup.measure(runs=15 if quick else 40, torch_runs=4 if quick else 10)
    rows += bench_overhead.measure(calls=5000 if quick else 20000, blocks=7 if quick else 15)
    rows += bench_taubin.measure([4, 5] if quick else [4, 5, 6, 7])
    rows += bench_warp.measure(calls=1000 if quick else 2000, blocks=7 if quick else 15)
    rows += bench_grad_health.measure(steps=20 if quick else 50, count=7 if quick else 15)
    print_table(
        rows,
        f"autograd-guard benchmarks, Python {sys.version.split()[0]}, "
        "medians; ratio = guarded / baseline",
    )


if __name__ == "__main__":
    main()
