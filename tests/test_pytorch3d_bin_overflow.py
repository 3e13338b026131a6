"""Guard pytorch3d_bin_overflow: what overflows a bin of PyTorch3D's coarse rasterizer.

The overflow that drops faces happens in the CUDA kernel only (on the CPU, binning raises
instead). Here, without a GPU:

- the guard's count of elements per bin is checked against PyTorch3D's real CPU coarse
  rasterizer, which raises "Got too many ... per bin" exactly when a bin holds more than
  its capacity (it bins as the CUDA kernel does);
- ``CudaLikeRasterizer`` is a test double for the CUDA ``_C.rasterize_meshes`` /
  ``_C.rasterize_points``: it behaves as rasterize_coarse.cu does on overflow.

``scripts/gpu_pytorch3d_bin_overflow.py`` shows the same with the real CUDA kernels.
Needs the real ``pytorch3d._C``; skipped where only PyTorch3D's Python code is installed.
"""

from __future__ import annotations

import sys

import pytest
import torch

pytest.importorskip("pytorch3d._C")

from helpers import assert_attached
from pytorch3d.renderer import rasterize_meshes, rasterize_points
from pytorch3d.structures import Meshes, Pointclouds
from pytorch3d.utils import ico_sphere

import autograd_guard
from autograd_guard.guards import pytorch3d_bin_overflow as guard_module
from autograd_guard.testing import capture_events

pytestmark = pytest.mark.skipif(
    not hasattr(sys.modules["pytorch3d._C"], "rasterize_meshes"),
    reason="needs PyTorch3D's compiled pytorch3d._C; only its Python code is installed",
)
_C = sys.modules["pytorch3d._C"]
WARNING = "Bin size was too small in the coarse rasterization phase."
SIZE, BIN, CAPACITY = 64, 8, 100  # what CUDA's default bin_size is for 64 pixels


def small_dense_mesh(level: int = 3, scale: float = 0.3) -> Meshes:
    torch.manual_seed(level)
    sphere = ico_sphere(level)
    verts = sphere.verts_packed() * scale + torch.randn(3) * 0.1
    verts[:, 2] += 2.0
    return Meshes([verts], [sphere.faces_packed()])


def face_args(mesh: Meshes, size: tuple[int, int], blur: float, capacity: int) -> tuple:
    face_verts = mesh.verts_packed()[mesh.faces_packed()]
    faces = len(face_verts)
    first, count = torch.tensor([0]), torch.tensor([faces])
    neighbours = torch.full((faces,), -1)
    return (face_verts, first, count, neighbours, size, blur, 2, BIN, capacity, False, False, False)


def least_capacity(rasterize, args: tuple, at: int) -> int:
    """The least capacity PyTorch3D's CPU coarse rasterizer accepts (binary search)."""

    def overflows(capacity: int) -> bool:
        try:
            rasterize(*args[:at], capacity, *args[at + 1 :])
        except RuntimeError as exc:  # else "NOT IMPLEMENTED": the CPU has no fine step
            return "too many" in str(exc)
        return False

    low, high = 1, len(args[0]) + 1
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if overflows(middle) else (low, middle)
    return low


@pytest.mark.parametrize(
    ("level", "size", "blur"),
    [(3, (64, 64), 0.0), (4, (96, 96), 1e-3), (2, (33, 33), 1e-4), (3, (48, 80), 0.0)],
)
def test_count_is_what_the_real_coarse_rasterizer_bins(level, size, blur):
    args = face_args(small_dense_mesh(level, 0.5), size, blur, 1)
    layout = guard_module.Layout.of("rasterize_meshes", len(args))
    assert guard_module.most_in_one_bin(args, layout) == least_capacity(
        _C.rasterize_meshes, args, 8
    )


def test_point_count_is_what_the_real_coarse_rasterizer_bins():
    torch.manual_seed(0)
    points = torch.randn(2000, 3) * 0.2
    points[:, 2] = points[:, 2].abs() + 1.0
    points[:5, 2] = -1.0  # behind the camera: skipped
    radius = torch.rand(2000) * 0.05
    args = (points, torch.tensor([0]), torch.tensor([2000]), (64, 64), radius, 4, BIN, 1)
    layout = guard_module.Layout.of("rasterize_points", len(args))
    assert guard_module.most_in_one_bin(args, layout) == least_capacity(
        _C.rasterize_points, args, 7
    )


class CudaLikeRasterizer:
    """Test double for the CUDA ``_C.rasterize_meshes``, as rasterize_coarse.cu behaves:
    faces are binned by bounding box in chunks of 512; a chunk whose faces do not fit in
    a bin's remaining capacity is skipped for that bin, with the kernel's printf (here
    on stdout). Each bin's pixels are then rasterized from the faces that bin kept, by
    the real CPU naive rasterizer. Records the (bin_size, capacity) of each call."""

    def __init__(self) -> None:
        self.real = _C.rasterize_meshes
        self.calls: list[tuple[int, int]] = []

    def __call__(self, *args):
        bin_size, capacity = args[7], args[8]
        self.calls.append((bin_size, capacity))
        naive = (*args[:7], 0, 0, *args[9:])
        if bin_size == 0:
            return self.real(*naive)
        height, width = args[4]
        outputs = [t.clone() for t in self.real(*naive)]
        for by in range(1 + (height - 1) // bin_size):
            for bx in range(1 + (width - 1) // bin_size):
                kept = self._kept(args[0], args[5], height, width, by, bx, bin_size, capacity)
                if kept is None:
                    continue  # nothing overflowed here: the naive pixels stand
                face_verts = args[0].clone()
                face_verts[~kept, :, 0] = 1e3  # off screen: not rasterized
                binned = self.real(face_verts, *naive[1:])
                rows = slice(height - min(height, (by + 1) * bin_size), height - by * bin_size)
                cols = slice(width - min(width, (bx + 1) * bin_size), width - bx * bin_size)
                for out, part in zip(outputs, binned, strict=True):
                    out[:, rows, cols] = part[:, rows, cols]
        return tuple(outputs)

    @staticmethod
    def _kept(face_verts, blur, height, width, by, bx, bin_size, capacity):
        """The faces bin (by, bx) keeps (None: all of them)."""
        low, high = guard_module.bins_along(height, width, bin_size)
        y_lo, y_hi = low[by].item(), high[by].item()
        low, high = guard_module.bins_along(width, height, bin_size)
        x_lo, x_hi = low[bx].item(), high[bx].item()
        reach = blur**0.5
        xs, ys = face_verts[:, :, 0], face_verts[:, :, 1]
        inside = (
            (ys.amin(1) - reach <= y_hi)
            & (y_lo < ys.amax(1) + reach)
            & (xs.amin(1) - reach <= x_hi)
            & (x_lo < xs.amax(1) + reach)
            & (face_verts[:, :, 2].amin(1) >= 1e-8)
        )
        kept, used, overflow = torch.zeros_like(inside), 0, False
        for start in range(0, len(inside), 512):
            chunk = inside[start : start + 512]
            count = int(chunk.sum())
            if used + count > capacity:
                print(WARNING, "This caused an overflow, meaning output may be incomplete.")
                overflow = True
            else:
                kept[start : start + 512] = chunk
            used += count
        return kept if overflow else None


@pytest.fixture
def cuda_like(monkeypatch):
    double = CudaLikeRasterizer()
    monkeypatch.setattr(_C, "rasterize_meshes", double)
    monkeypatch.setattr(guard_module, "drops_silently", lambda tensor: True)
    return double


def render(mesh: Meshes, capacity: int = CAPACITY):
    return rasterize_meshes(mesh, SIZE, faces_per_pixel=2, bin_size=BIN, max_faces_per_bin=capacity)


def test_unguarded_cuda_drops_faces_and_only_prints(cuda_like, capsys):
    mesh = small_dense_mesh()
    naive = rasterize_meshes(mesh, SIZE, faces_per_pixel=2, bin_size=0)
    pix_to_face = render(mesh)[0]
    assert (pix_to_face >= 0).sum() < (naive[0] >= 0).sum()  # holes where faces dropped
    assert WARNING in capsys.readouterr().out  # all that says so


def test_guarded_every_face_is_rasterized(cuda_like, capsys):
    mesh = small_dense_mesh()
    naive = rasterize_meshes(mesh, SIZE, faces_per_pixel=2, bin_size=0)
    autograd_guard.install({})
    assert_attached("pytorch3d_bin_overflow", "pytorch3d._C:rasterize_meshes")
    with capture_events() as events:
        for _ in range(3):
            guarded = render(mesh)
    assert all(torch.equal(a, b) for a, b in zip(guarded, naive, strict=True))
    assert WARNING not in capsys.readouterr().out
    args = face_args(mesh, (SIZE, SIZE), 0.0, CAPACITY)
    most = guard_module.most_in_one_bin(args, guard_module.Layout.of("rasterize_meshes", 12))
    assert cuda_like.calls[-1] == (BIN, most) and most > CAPACITY
    [event] = events
    assert event["action"] == "bin_overflow" and event["most_in_one_bin"] == most
    assert event["retry"] == f"max_faces_per_bin={most}" and event["max_per_bin"] == CAPACITY
    assert "test_pytorch3d_bin_overflow.py" in event["callsite"]


def test_naive_retry_by_policy_or_when_the_buffer_is_too_big(cuda_like):
    mesh = small_dense_mesh()
    for options in ({"retry": "naive"}, {"max_buffer_bytes": 1000}):
        autograd_guard.install({"guards": {"pytorch3d_bin_overflow": options}})
        with capture_events() as events:
            render(mesh)
        assert cuda_like.calls[-1][0] == 0 and events[0]["retry"] == "bin_size=0"


def test_silent_when_every_bin_fits(cuda_like, capsys):
    autograd_guard.install({})
    assert_attached("pytorch3d_bin_overflow", "pytorch3d._C:rasterize_meshes")
    with capture_events() as events:
        render(small_dense_mesh(), capacity=10000)
        rasterize_meshes(small_dense_mesh(), SIZE, bin_size=0)
    assert events == [] and cuda_like.calls == [(BIN, 10000), (0, 10000)]
    assert WARNING not in capsys.readouterr().out


def test_cpu_calls_are_left_alone():
    autograd_guard.install({})
    with capture_events() as events, pytest.raises(RuntimeError, match="too many faces"):
        render(small_dense_mesh())  # what PyTorch3D's CPU binning does, unchanged
    assert events == []


def test_observe_names_it_and_the_faces_still_drop(cuda_like, capsys):
    autograd_guard.install({"mode": "observe"})
    with capture_events() as events:
        render(small_dense_mesh())
    assert events[0]["mode"] == "observe" and cuda_like.calls == [(BIN, CAPACITY)]
    assert WARNING in capsys.readouterr().out


def test_strict_raises_before_rasterizing(cuda_like):
    autograd_guard.install("strict")
    with pytest.raises(autograd_guard.GuardError, match="pytorch3d_bin_overflow"):
        render(small_dense_mesh())
    assert cuda_like.calls == []


def test_points_get_a_capacity_that_fits(monkeypatch):
    calls = []
    real = _C.rasterize_points
    monkeypatch.setattr(_C, "rasterize_points", lambda *a: calls.append(a[6:8]) or real(*a))
    monkeypatch.setattr(guard_module, "drops_silently", lambda tensor: True)
    autograd_guard.install({})
    torch.manual_seed(0)
    points = torch.randn(1, 3000, 3) * 0.1
    points[..., 2] += 2.0
    clouds = Pointclouds(points)
    with capture_events() as events, pytest.raises(RuntimeError, match="NOT IMPLEMENTED"):
        rasterize_points(clouds, SIZE, 0.02, bin_size=BIN, max_points_per_bin=50)
    [event] = events
    assert event["element"] == "points" and calls == [(BIN, event["most_in_one_bin"])]


def test_uninstall_restores_the_original(cuda_like):
    autograd_guard.install({})
    assert _C.rasterize_meshes.__wrapped__ is cuda_like
    autograd_guard.uninstall()
    assert _C.rasterize_meshes is cuda_like
