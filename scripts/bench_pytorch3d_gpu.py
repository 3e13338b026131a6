"""Per-step cost of the PyTorch3D guards on CUDA, side by side with unguarded.

Each case is a training step on the GPU at a user's size (zero_grad, forward, backward,
Adam): blocks of steps with one guard installed (every other guard off) and with none
alternate in one process; the table holds the median time per step of each (synchronized
around each timed block, after warm-up steps) and the host syncs of one step (counted by
``torch.cuda.set_sync_debug_mode``). bin_overflow: ``rasterize_meshes`` (binned, CUDA's
default) of 4 ico_sphere(4) meshes at 256 px that fit their bins, the common case, where
the guard counts the faces per bin on every call; for scale, a small ico_sphere(6) that
overflows, guarded (a capacity that fits) vs bare (faces dropped; the kernel's printf to
/dev/null) and vs bare naive (``bin_size=0``). face_normals: 4 ico_sphere(4) fit on
``faces_normals_packed()`` (plain-torch normals beside the library's, and a hook that reads
"any nonzero" in every backward; in observe mode the hook alone). hard_silhouette:
``SoftSilhouetteShader`` at 256 px with ``blur_radius=0`` (a hook reads the alpha gradient
in every backward) and with the tutorials' blur, 50 faces per pixel (the guard out of the
way). euler_gimbal: ``matrix_to_euler_angles`` of 8 rotations from quaternions (one sync
per call). Needs an NVIDIA GPU and PyTorch3D's compiled extension (easypytorch3d's wheel).

    python scripts/bench_pytorch3d_gpu.py [--steps 20 --blocks 7 --quick --cases bins ...]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from benchtable import Row, print_table

import autograd_guard
from autograd_guard.guards import BUILTIN
from autograd_guard.testing import capture_events

Step = Callable[[], None]
Build = Callable[[], Step]  # a fresh step (parameters, optimizer) on the case's data
DEVICE = "cuda"
WARM_UP = 5
SIGMA = 1e-4  # SoftSilhouetteShader's default BlendParams.sigma


def policy(guard: str) -> dict[str, Any]:
    """The one guard measured (``name:mode`` for a mode of its own), every other guard off;
    its notes to ``logging``, not stderr (each install notes its late patch)."""
    guard, _, mode = guard.partition(":")
    modes = {"guards": {guard: {"mode": mode}}} if mode else {}
    return {"disable": [name for name in BUILTIN if name != guard], "log": "logging", **modes}


def sphere(level: int, scale: float, batch: int, z: float = 0.0) -> Any:
    from pytorch3d.structures import Meshes
    from pytorch3d.utils import ico_sphere

    mesh = ico_sphere(level, device=DEVICE)
    verts = mesh.verts_packed() * scale
    verts[:, 2] += z
    return Meshes([verts] * batch, [mesh.faces_packed()] * batch)


def fit(start: torch.Tensor, loss: Callable[[torch.Tensor], torch.Tensor]) -> Build:
    """Steps that move a parameter (from ``start``, by Adam) to lower ``loss``."""

    def build() -> Step:
        parameter = start.clone().requires_grad_()
        optimizer = torch.optim.Adam([parameter], lr=1e-4)

        def step() -> None:
            optimizer.zero_grad()
            loss(parameter).backward()
            optimizer.step()

        return step

    return build


def mesh_fit(meshes: Any, loss: Callable[[Any], torch.Tensor]) -> Build:
    """Steps that fit vertex offsets of ``meshes`` (a new Meshes each step)."""
    return fit(torch.zeros_like(meshes.verts_packed()), lambda o: loss(meshes.offset_verts(o)))


def raster_case(level: int, scale: float, batch: int, bin_size: int | None = None) -> Build:
    from pytorch3d.renderer.mesh.rasterize_meshes import rasterize_meshes

    def loss(meshes: Any) -> torch.Tensor:  # vertices in NDC, z > 0: in view
        _, zbuf, bary, dists = rasterize_meshes(meshes, 256, faces_per_pixel=1, bin_size=bin_size)
        return zbuf.sum() + bary.sum() + dists.sum()

    return mesh_fit(sphere(level, scale, batch, z=2.0), loss)


def normals_case() -> Build:
    torch.manual_seed(0)
    target = sphere(4, 1.0, 4).faces_normals_packed()
    target = torch.nn.functional.normalize(target + 0.1 * torch.randn_like(target), dim=1)

    def loss(meshes: Any) -> torch.Tensor:
        return (1 - (meshes.faces_normals_packed() * target).sum(1)).mean()

    return mesh_fit(sphere(4, 1.0, 4), loss)


def silhouette_case(blur: bool) -> Build:
    from pytorch3d import renderer as r

    settings = r.RasterizationSettings(
        image_size=256,
        blur_radius=math.log(1 / 1e-4 - 1) * SIGMA if blur else 0.0,
        faces_per_pixel=50 if blur else 1,
    )
    rotation, translation = r.look_at_view_transform(2.7, 0, 0, device=DEVICE)
    cameras = r.FoVPerspectiveCameras(device=DEVICE, R=rotation, T=translation)
    render = r.MeshRenderer(
        r.MeshRasterizer(cameras=cameras, raster_settings=settings),
        r.SoftSilhouetteShader(r.BlendParams(sigma=SIGMA)),
    )
    with torch.no_grad():
        target = render(sphere(4, 1.1, 1))[..., 3]

    def loss(meshes: Any) -> torch.Tensor:
        return ((render(meshes)[..., 3] - target) ** 2).mean()

    return mesh_fit(sphere(4, 1.0, 1), loss)


def euler_case() -> Build:
    from pytorch3d.transforms import rotation_conversions as rc

    torch.manual_seed(0)
    target = torch.randn(8, 3, device=DEVICE)

    def loss(quaternions: torch.Tensor) -> torch.Tensor:
        matrix = rc.quaternion_to_matrix(torch.nn.functional.normalize(quaternions, dim=1))
        return ((rc.matrix_to_euler_angles(matrix, "XYZ") - target) ** 2).sum()

    return fit(torch.randn(8, 4, device=DEVICE), loss)


def per_step(build: Build, steps: int) -> float:
    step = build()
    for _ in range(WARM_UP):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps * 1e3


def syncs(build: Build) -> int:
    """The host syncs of one step after a warm-up one (torch's sync debug mode)."""
    step = build()
    step()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def side_by_side(
    label: str, name: str, guard: str, builds: tuple[Build, Build | None], runs: tuple[int, int]
) -> list[Row]:
    """Two rows: the step's median time and its syncs, bare and guarded, in blocks (the
    guarded step is ``builds[0]``, the bare one ``builds[1]`` or the same)."""
    steps, count = runs
    samples: dict[str, list[float]] = {"bare": [], "guarded": []}
    counts: dict[str, int] = {}
    for block in range(count):
        for variant in ("bare", "guarded") if block % 2 else ("guarded", "bare"):
            build = builds[0] if variant == "guarded" else builds[1] or builds[0]
            if variant == "guarded":
                autograd_guard.install(policy(guard))
                if not autograd_guard.status()["guards"][guard.partition(":")[0]]["patched"]:
                    raise SystemExit(f"{guard} patched nothing: {autograd_guard.status()}")
            try:
                samples[variant].append(per_step(build, steps))
                if block == 0:
                    counts[variant] = syncs(build)
            finally:
                autograd_guard.uninstall()
    bare, guarded = (statistics.median(samples[v]) for v in ("bare", "guarded"))
    return [
        Row(label, name, bare, guarded, "ms"),
        Row(label, "  host syncs per step", counts["bare"], counts["guarded"], "syncs"),
    ]


BINS, NORMALS = "pytorch3d_bin_overflow", "pytorch3d_face_normals"
SILHOUETTE, EULER = "pytorch3d_hard_silhouette", "pytorch3d_euler_gimbal"


def cases(names: list[str]) -> Iterator[tuple[str, str, str, tuple[Build, Build | None]]]:
    """(label, case, guard, (step, bare step if another)) for each case asked for."""
    if "bins" in names:
        yield "bins", "4 x ico_sphere(4), 256 px, fit in bins", BINS, (raster_case(4, 0.8, 4), None)
    if "overflow" in names:
        build, naive = raster_case(6, 0.1, 1), raster_case(6, 0.1, 1, bin_size=0)
        yield "bins", "ico_sphere(6) overflows: guarded vs bare (drops)", BINS, (build, None)
        yield "bins", "ico_sphere(6) overflows: guarded vs bare naive", BINS, (build, naive)
    if "normals" in names:
        build, observe = normals_case(), f"{NORMALS}:observe"
        yield "normals", "4 x ico_sphere(4), faces_normals_packed", NORMALS, (build, None)
        yield "normals", "the same, observe mode: the hook alone", observe, (build, None)
    if "silhouette" in names:
        for blur, name in ((False, "blur_radius=0, K=1"), (True, "tutorial blur, K=50")):
            case = f"ico_sphere(4), 256 px, {name}"
            yield "silhouette", case, SILHOUETTE, (silhouette_case(blur), None)
    if "euler" in names:
        yield "euler", "8 rotations, quaternion -> matrix -> XYZ", EULER, (euler_case(), None)


@contextlib.contextmanager
def kernel_printf_hidden() -> Iterator[None]:
    """The coarse kernel's overflow printf writes to fd 1: /dev/null meanwhile."""
    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    try:
        yield
    finally:
        torch.cuda.synchronize()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


CASES = ("bins", "overflow", "normals", "silhouette", "euler")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="5 steps, 3 blocks")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_pytorch3d_gpu: needs CUDA (torch.cuda.is_available() is False)")
    try:
        import pytorch3d
        from pytorch3d import _C  # noqa: F401
    except ImportError as exc:
        sys.exit(f"bench_pytorch3d_gpu: needs PyTorch3D's compiled extension ({exc})")
    runs = (5, 3) if args.quick else (args.steps, args.blocks)
    start, rows = time.perf_counter(), []
    with capture_events() as events, kernel_printf_hidden():
        for label, name, guard, builds in cases(args.cases):
            rows += side_by_side(label, name, guard, builds, runs)
    print_table(
        rows,
        f"PyTorch3D guards on CUDA, one step (medians of {runs[1]} blocks of {runs[0]} "
        f"steps): {torch.cuda.get_device_name()}, torch {torch.__version__}, PyTorch3D "
        f"{pytorch3d.__version__}, autograd_guard {autograd_guard.__version__}",
    )
    seen = Counter(f"{e['guard']}:{e['action']}" for e in events)
    print(f"events: {dict(seen)}; {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
