"""Taubin smoothing: autograd-guard's dense path vs PyTorch3D's sparse one, side by side.

Each measurement runs in a child process of its own, so that its peak memory (peak RSS
above the RSS before the first run) is its own. PyTorch3D's backward is skipped above
ico_sphere(5): it takes minutes and gigabytes (its gradient is a dense V x V matrix).

    python scripts/bench_taubin.py [--levels 4 5 6 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchtable import Row, print_table  # noqa: E402

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {here!r})
import thirdparty
thirdparty.import_pytorch3d()
import torch
from pytorch3d.ops import mesh_filtering
from pytorch3d.structures import Meshes
from pytorch3d.utils import ico_sphere
from autograd_guard.taubin import taubin_smoothing as ours

impl, level, backward, reps = {impl!r}, {level}, {backward}, {reps}
function = ours if impl == "ours" else mesh_filtering.taubin_smoothing
mesh = ico_sphere(level)

def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024

def once():
    verts = mesh.verts_packed().clone().requires_grad_(backward)
    meshes = Meshes(verts=[verts], faces=[mesh.faces_packed()])
    start = time.perf_counter()
    with torch.set_grad_enabled(backward):
        out = function(meshes)
        if backward:
            out.verts_packed().sum().backward()
    return time.perf_counter() - start

before = rss_kib()
times = [once() for _ in range(reps)]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({{"times": times, "peak_mib": peak / 1024, "verts": mesh.verts_packed().shape[0]}}))
"""


def measure_one(impl: str, level: int, backward: bool, reps: int) -> dict[str, float]:
    code = CHILD.format(here=str(HERE), impl=impl, level=level, backward=backward, reps=reps)
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], check=True, capture_output=True, text=True
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    times = result["times"][1:] if len(result["times"]) > 2 else result["times"]  # warm-up
    return {
        "median_s": statistics.median(times),
        "peak_mib": result["peak_mib"],
        "verts": result["verts"],
    }


def measure(levels: list[int]) -> list[Row]:
    """Rows with PyTorch3D as the baseline and our dense path as the guarded figure."""
    rows = []
    nan = float("nan")
    for level in levels:
        for backward in (False, True):
            ours = measure_one("ours", level, backward, reps=6 if level < 7 else 3)
            theirs = None
            if not (backward and level > 5):
                theirs = measure_one(
                    "pytorch3d", level, backward, reps=1 if backward and level == 5 else 4
                )
            name = "forward + backward" if backward else "forward, no grad"
            goal = {
                (5, True): ">= 100x faster, <= 1/10 memory",
                (6, True): "< 1 s",
                (7, True): "< 5 s",
            }.get((level, backward), "" if backward else ">= 2x faster")
            mesh = f"ico_sphere({level}) V={ours['verts']}"
            rows.append(
                Row(
                    "taubin",
                    f"{mesh} {name}: ours vs PyTorch3D",
                    theirs["median_s"] if theirs else nan,
                    ours["median_s"],
                    "s",
                    goal,
                )
            )
            rows.append(
                Row(
                    "taubin",
                    f"{mesh} {name}: peak memory",
                    theirs["peak_mib"] if theirs else nan,
                    ours["peak_mib"],
                    "MiB",
                )
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--levels", type=int, nargs="+", default=[4, 5, 6, 7])
    args = parser.parse_args()
    print_table(
        measure(args.levels),
        "Taubin smoothing: PyTorch3D (baseline) vs autograd_guard.taubin (guarded); "
        "PyTorch3D's backward is skipped above ico_sphere(5)",
    )


if __name__ == "__main__":
    main()
