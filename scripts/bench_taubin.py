"""Taubin smoothing: autograd-guard's dense path vs PyTorch3D's sparse one, side by side.

Each measurement runs in a child process of its own, after one warm-up call; its peak
memory is the peak RSS (VmHWM, reset through /proc/self/clear_refs) above the RSS
before the timed calls. PyTorch3D's backward is skipped above
ico_sphere(5): it takes minutes and gigabytes (its gradient is a dense V x V matrix).

    python scripts/bench_taubin.py [--levels 4 5 6 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchtable import Row, print_table  # noqa: E402

CHILD = r"""
import json, sys, time
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

def status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

def once():
    verts = mesh.verts_packed().clone().requires_grad_(backward)
    meshes = Meshes(verts=[verts], faces=[mesh.faces_packed()])
    start = time.perf_counter()
    with torch.set_grad_enabled(backward):
        out = function(meshes)
        if backward:
            out.verts_packed().sum().backward()
    return time.perf_counter() - start

if reps > 1:
    once()  # warm-up
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
before = status_kib("VmRSS")
times = [once() for _ in range(reps)]
peak = status_kib("VmHWM") - before
print(json.dumps({{"times": times, "peak_mib": peak / 1024, "verts": mesh.verts_packed().shape[0]}}))
"""


def run_child(impl: str, level: int, backward: bool, reps: int, env: dict[str, str]) -> Any:
    code = CHILD.format(here=str(HERE), impl=impl, level=level, backward=backward, reps=reps)
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure_one(impl: str, level: int, backward: bool, reps: int) -> dict[str, float]:
    """Median time over ``reps`` runs, then the peak memory of one run in a second child.

    The memory child takes large blocks straight from mmap, so that freed memory leaves
    the RSS and the run's own peak shows instead of the allocator's reuse; that slows
    allocation, so it is never timed.
    """
    timed = run_child(impl, level, backward, reps, dict(os.environ))
    memory = run_child(impl, level, backward, 1, {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})
    return {
        "median_s": statistics.median(timed["times"]),
        "peak_mib": memory["peak_mib"],
        "verts": timed["verts"],
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
