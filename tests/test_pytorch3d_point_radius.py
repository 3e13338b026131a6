"""Guard pytorch3d_point_radius against PyTorch3D's compiled point rasterizer.

Needs the real ``pytorch3d._C`` (``nox -s py3.11-torch2.12.0-pytorch3d``); skipped where
only PyTorch3D's Python code is installed.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

pytest.importorskip("pytorch3d._C")

import pytorch3d.renderer
from helpers import assert_attached
from pytorch3d.renderer import (
    AlphaCompositor,
    FoVOrthographicCameras,
    PointsRasterizationSettings,
    PointsRasterizer,
)
from pytorch3d.structures import Pointclouds

import autograd_guard
from autograd_guard.testing import capture_events

pytestmark = pytest.mark.skipif(
    not hasattr(sys.modules["pytorch3d._C"], "rasterize_points"),
    reason="needs PyTorch3D's compiled pytorch3d._C; only its Python code is installed",
)
# the package's attribute of this name is the function: the module from sys.modules
module = importlib.import_module("pytorch3d.renderer.points.rasterize_points")
ORIGINAL = module.rasterize_points
PLACE = "pytorch3d.renderer.points.rasterizer:rasterize_points"
P, SIZE = 50, 32


def scene() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    points = torch.rand(P, 3) * 1.4 - 0.7
    points[:, 2] = points[:, 2].abs() + 1.0
    target = torch.zeros(1, SIZE, SIZE, 3)
    target[:, 8:24, 8:24] = 1.0
    return points.requires_grad_(), torch.full((1, P), 0.05, requires_grad=True), target


def render(points: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """PointsRasterizer with a per-point radius, composited as in pytorch3d#1562."""
    settings = PointsRasterizationSettings(image_size=SIZE, radius=radius, points_per_pixel=4)
    rasterizer = PointsRasterizer(cameras=FoVOrthographicCameras(), raster_settings=settings)
    fragments = rasterizer(Pointclouds([points], features=[torch.ones(P, 3)]))  # call site
    idx = fragments.idx.long()
    weights = (1 - fragments.dists / 0.05**2).clamp(0, 1) * (idx >= 0)
    compositor = AlphaCompositor(background_color=(0.0, 0.0, 0.0))
    image = compositor(idx.permute(0, 3, 1, 2), weights.permute(0, 3, 1, 2), torch.ones(3, P))
    return image.permute(0, 2, 3, 1)


def fit(steps: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    points, radius, target = scene()
    start = points.detach().clone()
    optimizer = torch.optim.Adam([points, radius], lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        ((render(points, radius) - target) ** 2).mean().backward()
        optimizer.step()
    return points.detach() - start, radius.detach(), radius.grad


def test_unguarded_the_image_depends_on_radius_but_radius_never_trains():
    points, _, _ = scene()
    covered = [
        int((ORIGINAL(Pointclouds([points]), SIZE, torch.full((1, P), r), 4)[0] >= 0).sum())
        for r in (0.02, 0.1)
    ]
    assert covered[0] < covered[1]  # the radius changes the rendered image
    moved, radius, grad = fit()
    assert moved.abs().sum() > 0  # the positions train
    assert grad is None and torch.equal(radius, torch.full((1, P), 0.05))  # the radii do not


def test_named_once_at_the_first_call_and_nothing_changes():
    unguarded = fit()
    autograd_guard.install({})
    assert_attached("pytorch3d_point_radius", PLACE)
    with capture_events() as events:
        guarded = fit()
    assert torch.equal(unguarded[0], guarded[0]) and guarded[2] is None  # no fix claimed
    [event] = [e for e in events if e["guard"] == "pytorch3d_point_radius"]
    assert event["action"] == "radius_not_differentiable" and event["mode"] == "fix"
    assert event["radius_shape"] == [1, P] and "radius.detach()" in event["remedy"]
    assert "test_pytorch3d_point_radius.py" in event["callsite"]
    assert event["target"] == "pytorch3d.renderer.points.rasterize_points:rasterize_points"


def test_direct_calls_are_named_at_their_own_call_site():
    autograd_guard.install({})
    points, radius, _ = scene()
    with capture_events() as events:
        for _ in range(3):
            pytorch3d.renderer.rasterize_points(Pointclouds([points]), SIZE, radius)
        pytorch3d.renderer.points.rasterize_points(Pointclouds([points]), radius=radius)
    assert len(events) == 2 and len({e["callsite"] for e in events}) == 2


def test_silent_on_correct_code():
    autograd_guard.install({})
    assert_attached("pytorch3d_point_radius", PLACE)
    points, radius, _ = scene()
    clouds = Pointclouds([points])
    with capture_events() as events:
        pytorch3d.renderer.rasterize_points(clouds, SIZE, 0.05)  # a float radius
        pytorch3d.renderer.rasterize_points(clouds, SIZE, radius.detach())  # said so
        pytorch3d.renderer.rasterize_points(clouds, SIZE, torch.full((1, P), 0.05))
        with torch.no_grad():
            pytorch3d.renderer.rasterize_points(clouds, SIZE, radius)
    assert events == []


def test_observe_names_it():
    autograd_guard.install({"mode": "observe"})
    points, radius, _ = scene()
    with capture_events() as events:
        pytorch3d.renderer.rasterize_points(Pointclouds([points]), SIZE, radius)
    [event] = events
    assert event["mode"] == "observe" and event["action"] == "radius_not_differentiable"


def test_strict_raises_before_rasterizing(monkeypatch):
    autograd_guard.install("strict")
    entered = []
    monkeypatch.setattr(module._RasterizePoints, "apply", lambda *a: entered.append(a))
    points, radius, _ = scene()
    with pytest.raises(autograd_guard.GuardError, match="pytorch3d_point_radius"):
        pytorch3d.renderer.rasterize_points(Pointclouds([points]), SIZE, radius)
    assert entered == []


def test_uninstall_restores_the_original():
    from pytorch3d.renderer.points import rasterizer

    autograd_guard.install({})
    assert rasterizer.rasterize_points.__wrapped__ is ORIGINAL
    autograd_guard.uninstall()
    assert rasterizer.rasterize_points is pytorch3d.renderer.rasterize_points is ORIGINAL
