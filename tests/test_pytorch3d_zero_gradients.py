"""grad_health's zero_gradient finding on PyTorch3D's real rasterizer (``pytorch3d._C``):
a silhouette rendered hard (``blur_radius=0``, ``sigma`` near 0) gives every vertex an
exactly zero gradient, step after step; the tutorial's soft settings do not."""

from __future__ import annotations

import math

import pytest
import pytorch3d  # noqa: F401  (conftest puts PyTorch3D on the path)
import torch

import autograd_guard
from autograd_guard.testing import capture_events

_C = pytest.importorskip("pytorch3d._C")
if not hasattr(_C, "rasterize_meshes"):
    pytest.skip(
        "needs PyTorch3D's compiled extension pytorch3d._C (its rasterizer); this "
        "environment has only PyTorch3D's Python code",
        allow_module_level=True,
    )

from pytorch3d.renderer import (  # noqa: E402
    BlendParams,
    FoVPerspectiveCameras,
    MeshRasterizer,
    MeshRenderer,
    RasterizationSettings,
    SoftSilhouetteShader,
    look_at_view_transform,
)
from pytorch3d.utils import ico_sphere  # noqa: E402


def renderer(sigma: float, blur: float, faces: int) -> MeshRenderer:
    R, T = look_at_view_transform(2.7, 0, 0)
    settings = RasterizationSettings(image_size=32, blur_radius=blur, faces_per_pixel=faces)
    return MeshRenderer(
        MeshRasterizer(FoVPerspectiveCameras(R=R, T=T), settings),
        SoftSilhouetteShader(BlendParams(sigma=sigma, gamma=1e-4)),
    )


def fit(render: MeshRenderer, steps: int = 20) -> tuple[list[dict], list[float]]:
    """Deform a sphere towards a smaller sphere's silhouette, as the tutorials do."""
    mesh = ico_sphere(2)
    with torch.no_grad():
        target = renderer(1e-4, 0.0, 1)(mesh.scale_verts(0.8))[..., 3]
    offsets = torch.zeros_like(mesh.verts_packed(), requires_grad=True)
    optimizer = torch.optim.Adam([offsets], lr=0.01)
    losses = []
    with capture_events() as events:
        for _ in range(steps):
            optimizer.zero_grad()
            silhouette = render(mesh.offset_verts(offsets))[..., 3]
            loss = ((silhouette - target) ** 2).mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return [e for e in events if e["guard"] == "grad_health"], losses


def test_a_hard_silhouette_fit_is_said_to_learn_nothing():
    autograd_guard.install({})
    events, losses = fit(renderer(sigma=1e-10, blur=0.0, faces=1))
    assert len(set(losses)) == 1  # the loss never moves
    [event] = events
    assert event["action"] == "zero_gradient" and event["steps"] == 20
    assert "blur_radius" in event["remedy"] and event["callsite"].startswith(__file__)


def test_the_tutorial_settings_train_and_are_silent():
    autograd_guard.install({})
    sigma = 1e-4
    events, losses = fit(renderer(sigma, math.log(1 / 1e-4 - 1) * sigma, 50))
    assert events == [] and losses[-1] < losses[0]
