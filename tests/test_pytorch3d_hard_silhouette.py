"""Guard pytorch3d_hard_silhouette against PyTorch3D's compiled mesh rasterizer and
silhouette blending, in a camera fit as in PyTorch3D's camera_position_optimization
tutorial.

Needs the real ``pytorch3d._C`` (``nox -s py3.11-torch2.12.0-pytorch3d``); skipped where
only PyTorch3D's Python code is installed.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch

pytest.importorskip("pytorch3d._C")

from helpers import assert_attached
from pytorch3d.renderer import (
    BlendParams,
    FoVPerspectiveCameras,
    MeshRasterizer,
    MeshRenderer,
    MeshRendererWithFragments,
    PointLights,
    RasterizationSettings,
    SoftPhongShader,
    SoftSilhouetteShader,
    TexturesVertex,
    look_at_rotation,
    look_at_view_transform,
)
from pytorch3d.renderer.mesh import renderer as module
from pytorch3d.structures import Meshes
from pytorch3d.utils import ico_sphere

import autograd_guard
from autograd_guard.testing import capture_events

pytestmark = pytest.mark.skipif(
    not hasattr(sys.modules["pytorch3d._C"], "rasterize_meshes"),
    reason="needs PyTorch3D's compiled pytorch3d._C; only its Python code is installed",
)
ORIGINAL = module.MeshRenderer.forward
PLACE = "pytorch3d.renderer.mesh.renderer:MeshRenderer.forward"
TUTORIAL_BLUR = math.log(1.0 / 1e-4 - 1.0) * 1e-4


def ellipsoid() -> Meshes:
    sphere = ico_sphere(2)
    verts = sphere.verts_packed() * torch.tensor([1.0, 0.5, 0.3])
    return Meshes([verts], [sphere.faces_packed()])


def silhouette_renderer(sigma: float, blur: float, faces: int, kind: type = MeshRenderer):
    settings = RasterizationSettings(image_size=64, blur_radius=blur, faces_per_pixel=faces)
    rasterizer = MeshRasterizer(cameras=FoVPerspectiveCameras(), raster_settings=settings)
    return kind(rasterizer, SoftSilhouetteShader(BlendParams(sigma=sigma)))


def reference() -> torch.Tensor:
    R, T = look_at_view_transform(3.0, 30.0, 40.0)
    with torch.no_grad():
        return silhouette_renderer(1e-10, 0.0, 1)(ellipsoid(), R=R, T=T)[..., 3]


def camera_fit(renderer, steps: int) -> tuple[list[float], list[torch.Tensor]]:
    """The tutorial's loop: a camera position fitted to a reference silhouette with Adam."""
    mesh, target = ellipsoid(), reference()
    position = torch.tensor([3.0, 6.9, 2.5], requires_grad=True)
    optimizer = torch.optim.Adam([position], lr=0.2)
    losses, grads = [], []
    for _ in range(steps):
        optimizer.zero_grad()
        R = look_at_rotation(position[None])
        T = -torch.bmm(R.transpose(1, 2), position[None, :, None])[:, :, 0]
        image = renderer(mesh, R=R, T=T)  # the call site
        image = image[0] if isinstance(image, tuple) else image
        loss = ((image[..., 3] - target) ** 2).sum()
        loss.backward()
        losses.append(loss.item())
        grads.append(position.grad.clone())
        optimizer.step()
    return losses, grads


def test_unguarded_hard_settings_give_exactly_zero_gradients():
    losses, grads = camera_fit(silhouette_renderer(1e-10, 0.0, 1), steps=5)
    assert all(torch.equal(g, torch.zeros(3)) for g in grads)
    assert len(set(losses)) == 1 and losses[0] > 0  # wrong, and never moves
    losses, grads = camera_fit(silhouette_renderer(1e-4, TUTORIAL_BLUR, 50), steps=10)
    assert losses[-1] < 0.9 * losses[0]  # the tutorial's settings fit


def test_named_at_the_first_render_once_and_nothing_changes():
    renderer = silhouette_renderer(1e-4, 0.0, 1)
    unguarded, _ = camera_fit(renderer, steps=3)
    autograd_guard.install({})
    assert_attached("pytorch3d_hard_silhouette", PLACE)
    with capture_events() as events:
        guarded, _ = camera_fit(renderer, steps=3)
    assert guarded == unguarded
    [event] = events
    assert event["action"] == "no_silhouette_gradient" and event["mode"] == "fix"
    assert (event["sigma"], event["blur_radius"], event["faces_per_pixel"]) == (1e-4, 0.0, 1)
    assert event["suggested_blur_radius"] == pytest.approx(TUTORIAL_BLUR)
    assert "blur_radius=0.000921" in event["remedy"] and "faces_per_pixel=50" in event["remedy"]
    assert "test_pytorch3d_hard_silhouette.py" in event["callsite"]


def test_with_fragments_and_a_settings_override():
    autograd_guard.install({})
    renderer = silhouette_renderer(1e-4, TUTORIAL_BLUR, 50, MeshRendererWithFragments)
    hard = RasterizationSettings(image_size=64, blur_radius=0.0, faces_per_pixel=1)
    verts = ellipsoid().verts_packed().clone().requires_grad_()
    mesh = Meshes([verts], [ellipsoid().faces_packed()])
    R, T = look_at_view_transform(3.0, 30.0, 40.0)
    with capture_events() as events:
        images, fragments = renderer(mesh, R=R, T=T)
        assert events == [] and images.requires_grad and fragments.pix_to_face.shape[-1] == 50
        renderer(mesh, R=R, T=T, raster_settings=hard)
    [event] = events
    assert event["target"] == "pytorch3d.renderer.mesh.renderer:MeshRendererWithFragments.forward"


def test_silent_on_correct_code():
    autograd_guard.install({})
    assert_attached("pytorch3d_hard_silhouette", PLACE)
    R, T = look_at_view_transform(3.0, 30.0, 40.0)
    verts = ellipsoid().verts_packed().clone().requires_grad_()
    mesh = Meshes([verts], [ellipsoid().faces_packed()])
    with capture_events() as events:
        camera_fit(silhouette_renderer(1e-4, TUTORIAL_BLUR, 50), steps=2)
        hard = silhouette_renderer(1e-4, 0.0, 1)
        hard(ellipsoid(), R=R, T=T)  # a mask for its own sake: nothing requires grad
        with torch.no_grad():
            hard(mesh, R=R, T=T)
        # Soft RGB shaders keep shading gradients with blur_radius=0: not named.
        colored = Meshes([verts], [ellipsoid().faces_packed()], TexturesVertex([verts * 0 + 1]))
        settings = RasterizationSettings(image_size=64, blur_radius=0.0, faces_per_pixel=1)
        cameras = FoVPerspectiveCameras(R=R, T=T)
        phong = MeshRenderer(
            MeshRasterizer(cameras=cameras, raster_settings=settings),
            SoftPhongShader(cameras=cameras, lights=PointLights(location=[[0.0, 0.0, 3.0]])),
        )
        phong(colored)[..., :3].sum().backward()
    assert events == []
    assert verts.grad is not None and verts.grad.abs().sum() > 0


def test_observe_names_it():
    autograd_guard.install({"mode": "observe"})
    with capture_events() as events:
        camera_fit(silhouette_renderer(1e-10, 0.0, 1), steps=2)
    [event] = events
    assert event["mode"] == "observe"


def test_strict_raises():
    autograd_guard.install("strict")
    with pytest.raises(autograd_guard.GuardError, match="pytorch3d_hard_silhouette"):
        camera_fit(silhouette_renderer(1e-4, 0.0, 1), steps=1)
    camera_fit(silhouette_renderer(1e-4, TUTORIAL_BLUR, 50), steps=1)  # no raise


def test_uninstall_restores_the_original():
    autograd_guard.install({})
    assert module.MeshRenderer.forward.__wrapped__ is ORIGINAL
    autograd_guard.uninstall()
    assert module.MeshRenderer.forward is ORIGINAL
