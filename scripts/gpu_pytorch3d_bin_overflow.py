"""pytorch3d_bin_overflow on PyTorch3D's real CUDA rasterizers, for a machine with an
NVIDIA GPU and PyTorch3D's compiled extension (easypytorch3d's wheel, or a source build).

    python scripts/gpu_pytorch3d_bin_overflow.py

A dense mesh (ico_sphere(6), 81,920 faces) and a blob of 200,000 points, small on a
256-pixel image, are rasterized with PyTorch3D's CUDA defaults (binned; 16,384 faces /
40,000 points per bin at most). Unguarded, the coarse kernel drops what overflows: fewer
pixels are covered than by naive rasterization (bin_size=0), and the only sign is the
kernel's printf on stdout. Guarded, the output equals the naive one and one event names
it. A third run checks the guard's count against the kernel itself: with the capacity
set to the count, nothing overflows; one below, the kernel prints its warning.
Each case runs in a child interpreter; exits 1 if any check fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

MARKER = "RESULT:"
WARNING = "Bin size was too small in the coarse rasterization phase"
CHILD = """
import json, os, torch
import autograd_guard
from autograd_guard.testing import capture_events
if os.environ["GUARDED"] == "1":
    autograd_guard.install({})
from pytorch3d.renderer import rasterize_meshes, rasterize_points
from pytorch3d.structures import Meshes, Pointclouds
from pytorch3d.utils import ico_sphere
device = "cuda"
sphere = ico_sphere(6, device=device)
verts = sphere.verts_packed() * 0.1
verts[:, 2] += 2.0
mesh = Meshes([verts], [sphere.faces_packed()])
torch.manual_seed(0)
points = torch.randn(1, 200_000, 3, device=device) * 0.03
points[..., 2] += 2.0
clouds = Pointclouds(points)
out = {}
with capture_events() as events:
    for name, render in (
        ("faces", lambda **kw: rasterize_meshes(mesh, 256, faces_per_pixel=1, **kw)[0]),
        ("points", lambda **kw: rasterize_points(clouds, 256, 0.01, 1, **kw)[0]),
    ):
        binned, naive = render(), render(bin_size=0)
        torch.cuda.synchronize()
        out[name] = {"covered": int((binned >= 0).sum()), "naive": int((naive >= 0).sum()),
                     "equal": bool(torch.equal(binned, naive))}
if os.environ["GUARDED"] == "2":  # the guard's count against the kernel
    from autograd_guard.guards import pytorch3d_bin_overflow as guard
    face_verts = verts[sphere.faces_packed()]
    args = (face_verts, mesh.mesh_to_faces_packed_first_idx(), mesh.num_faces_per_mesh(),
            torch.full((len(face_verts),), -1, device=device), (256, 256), 0.0, 1, 16, 1,
            False, False, False)
    most = guard.most_in_one_bin(args, guard.Layout.of("rasterize_meshes", 12))
    torch.cuda.synchronize()
    print("\\nCOUNT", most, flush=True)
    rasterize_meshes(mesh, 256, faces_per_pixel=1, bin_size=16, max_faces_per_bin=most)
    torch.cuda.synchronize()
    print("\\nFITS-END", flush=True)
    rasterize_meshes(mesh, 256, faces_per_pixel=1, bin_size=16, max_faces_per_bin=most - 1)
    torch.cuda.synchronize()
    print("\\nBELOW-END", flush=True)
    out["count"] = most
out["events"] = [{k: e.get(k) for k in ("action", "element", "most_in_one_bin", "retry")}
                 for e in events if e["guard"] == "pytorch3d_bin_overflow"]
print("\\n" + MARKER + json.dumps(out), flush=True)
""".replace("MARKER", repr(MARKER))


def run(guarded: str) -> tuple[dict[str, Any], str] | None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        env={**os.environ, "GUARDED": guarded},
        capture_output=True,
        text=True,
    )
    if child.returncode:
        print(child.stdout[-2000:], child.stderr[-3000:])
        return None
    result = json.loads(child.stdout.rpartition(MARKER)[2])
    return result, child.stdout.rpartition(MARKER)[0]


def main() -> int:
    runs = [run(mode) for mode in ("0", "1", "2")]
    if None in runs:
        return 1
    (bare, bare_out), (guarded, guarded_out), (counted, counted_out) = runs  # type: ignore[misc]
    checks = []
    for name in ("faces", "points"):
        checks += [
            (f"unguarded {name}: dropped", bare[name]["covered"] < bare[name]["naive"]),
            (f"guarded {name}: equal to naive", guarded[name]["equal"]),
        ]
        print(f"{name}: unguarded {bare[name]}, guarded {guarded[name]}")
    checks += [
        ("unguarded: the kernel's printf is all that says so", WARNING in bare_out),
        ("guarded: no overflow printf", WARNING not in guarded_out),
        ("guarded: one event per call site", len(guarded["events"]) == 2),
    ]
    fits, _, below = counted_out.partition("FITS-END")
    checks += [
        ("count: capacity = count fits", WARNING not in fits.partition("COUNT")[2]),
        ("count: capacity = count - 1 overflows", WARNING in below),
    ]
    print("events:", guarded["events"], "count:", counted.get("count"))
    for what, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
