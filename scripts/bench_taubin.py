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


def measure(impl: str, level: int, backward: bool, reps: int) -> dict[str, float]:
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--levels", type=int, nargs="+", default=[4, 5, 6, 7])
    args = parser.parse_args()
    print(
        f"{'mesh':<14} {'V':>7} {'pass':<18} {'pytorch3d':>12} {'ours':>10} {'speed-up':>9}"
        f" {'p3d peak':>10} {'our peak':>10} {'mem ratio':>9}"
    )
    for level in args.levels:
        for backward in (False, True):
            ours = measure("ours", level, backward, reps=6 if level < 7 else 3)
            if backward and level > 5:
                theirs = None
            else:
                reps = 1 if backward and level == 5 else 4
                theirs = measure("pytorch3d", level, backward, reps)
            name = "forward + backward" if backward else "forward, no grad"
            row = f"ico_sphere({level})  {ours['verts']:>7} {name:<18} "
            if theirs:
                row += (
                    f"{theirs['median_s']:>11.3f}s {ours['median_s']:>9.3f}s "
                    f"{theirs['median_s'] / ours['median_s']:>8.1f}x "
                    f"{theirs['peak_mib']:>8.0f}Mi {ours['peak_mib']:>8.0f}Mi "
                    f"{ours['peak_mib'] / max(theirs['peak_mib'], 1e-9):>8.3f}x"
                )
            else:
                row += (
                    f"{'skipped':>12} {ours['median_s']:>9.3f}s {'':>9} {'':>10} "
                    f"{ours['peak_mib']:>8.0f}Mi"
                )
            print(row, flush=True)
    print(
        "\ngoals: ico_sphere(5) forward+backward >= 100x faster with <= 1/10 of the peak "
        "memory; ico_sphere(6) < 1 s, ico_sphere(7) < 5 s; forward >= 2x faster"
    )


if __name__ == "__main__":
    main()
