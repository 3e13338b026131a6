"""pytorch3d_bin_overflow's count of elements per bin, without PyTorch3D: the guard's
count (bins covered per element, summed per mesh in a difference array, one read) equals
the plain one (an element x bins matrix per mesh, multiplied out), for batches of meshes
(empty ones too) and point clouds, blur, per-point radii, elements behind the camera,
NaN and infinite coordinates. ``tests/test_pytorch3d_bin_overflow.py`` checks the count
against PyTorch3D's real coarse rasterizer."""

from __future__ import annotations

import pytest
import torch

from autograd_guard.guards import pytorch3d_bin_overflow as guard_module


def plain_count(args: tuple, layout: guard_module.Layout) -> int:
    """Each mesh's elements x bins membership, multiplied out: exact, and slow."""
    elements = args[0]
    low, high, skip = guard_module._bounding_boxes(elements, args[layout.size], layout.kind)
    height, width = args[layout.image]
    y_low, y_high = guard_module.bins_along(height, width, args[layout.bins])
    x_low, x_high = guard_module.bins_along(width, height, args[layout.bins])
    rows = ((low[:, 1:2] <= y_high) & (y_low < high[:, 1:2]) & ~skip[:, None]).float()
    columns = ((low[:, 0:1] <= x_high) & (x_low < high[:, 0:1])).float()
    most = 0
    for start, count in zip(args[1].tolist(), args[2].tolist(), strict=True):
        if count:
            part = rows[start : start + count].T @ columns[start : start + count]
            most = max(most, int(part.max()))
    return most


def spoil(xyz: torch.Tensor, generator: torch.Generator) -> None:
    """A few NaN, infinite and behind-the-camera coordinates."""
    n = xyz.shape[0]
    for value in (float("nan"), float("inf"), -float("inf"), -1.0):
        picks = torch.randint(0, n, (3,), generator=generator)
        xyz[picks, ..., int(torch.randint(0, 3, (1,), generator=generator))] = value


def packed(counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    first = torch.tensor([sum(counts[:i]) for i in range(len(counts))])
    return first, torch.tensor(counts)


@pytest.mark.parametrize("seed", range(12))
def test_face_count_equals_the_plain_count(seed):
    generator = torch.Generator().manual_seed(seed)
    counts = [int(c) for c in torch.randint(0, 300, (1 + seed % 4,), generator=generator)]
    counts[seed % len(counts)] *= seed % 2  # an empty mesh in half the batches
    faces = sum(counts)
    face_verts = torch.randn(faces, 3, 3, generator=generator) * (0.2 + 0.1 * (seed % 3))
    face_verts[..., 2] = face_verts[..., 2].abs() + 0.5
    if faces:
        spoil(face_verts, generator)
    size = [(64, 64), (48, 80), (33, 33), (96, 40)][seed % 4]
    blur = [0.0, 1e-4, 1e-2][seed % 3]
    first, count = packed(counts)
    args = (face_verts, first, count, torch.full((faces,), -1), size, blur, 2, 8, 1, False)
    args += (False, False)
    layout = guard_module.Layout.of("rasterize_meshes", len(args))
    assert guard_module.most_in_one_bin(args, layout) == plain_count(args, layout)


@pytest.mark.parametrize("seed", range(8))
def test_point_count_equals_the_plain_count(seed):
    generator = torch.Generator().manual_seed(100 + seed)
    counts = [int(c) for c in torch.randint(1, 500, (1 + seed % 3,), generator=generator)]
    points = torch.randn(sum(counts), 3, generator=generator) * 0.3
    points[:, 2] = points[:, 2].abs() + 0.5
    spoil(points, generator)
    radius = torch.rand(sum(counts), generator=generator) * 0.1 if seed % 2 else 0.05
    first, count = packed(counts)
    size = [(64, 64), (40, 72)][seed % 2]
    args = (points, first, count, size, radius, 4, [8, 16][seed % 2], 1)
    layout = guard_module.Layout.of("rasterize_points", len(args))
    assert guard_module.most_in_one_bin(args, layout) == plain_count(args, layout)


def test_an_empty_batch_counts_nothing():
    args = (torch.zeros(0, 3, 3), *packed([0]), torch.zeros(0), (32, 32), 0.0, 2, 8, 1)
    args += (False, False, False)
    assert guard_module.most_in_one_bin(args, guard_module.Layout.of("rasterize_meshes", 12)) == 0


@pytest.mark.parametrize("radius", [0.0, 1e-3])
def test_elements_on_the_bin_edges_count_as_the_kernel_tests_them(radius):
    """``low <= bin_high`` takes an element ending on a bin's upper edge; ``bin_low <
    high`` leaves one starting on its lower edge out."""
    size, bin_size = (40, 56), 8
    y_low, y_high = guard_module.bins_along(size[0], size[1], bin_size)
    x_low, x_high = guard_module.bins_along(size[1], size[0], bin_size)
    ys = torch.cat([y_low, y_high]) - radius
    xs = torch.cat([x_low, x_high]) + radius
    grid = torch.cartesian_prod(ys, xs)
    points = torch.cat([grid.flip(1), torch.ones(len(grid), 1)], dim=1)
    args = (points, *packed([len(points)]), size, radius, 4, bin_size, 1)
    layout = guard_module.Layout.of("rasterize_points", len(args))
    assert guard_module.most_in_one_bin(args, layout) == plain_count(args, layout)
