"""Guard pytorch3d_hard_silhouette against PyTorch3D's compiled mesh rasterizer and
silhouette blending, in a camera fit as in PyTorch3D's camera_position_optimization
tutorial.

Needs the real ``pytorch3d._C`` (``nox -s py3.11-torch2.12.0-pytorch3d``); skipped where
only PyTorch3D's Python code is installed.
"""

from __future__ import annotations

import linecache
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


def test_named_at_the_first_backward_once_and_nothing_changes():
    renderer = silhouette_renderer(1e-4, 0.0, 1)
    unguarded, unguarded_grads = camera_fit(renderer, steps=3)
    autograd_guard.install({})
    assert_attached("pytorch3d_hard_silhouette", PLACE)
    R, T = look_at_view_transform(3.0, 30.0, 40.0)
    verts = ellipsoid().verts_packed().clone().requires_grad_()
    with capture_events() as events:
        image = renderer(Meshes([verts], [ellipsoid().faces_packed()]), R=R, T=T)
        assert image.requires_grad and events == []  # said in backward(), not at the render
        guarded, guarded_grads = camera_fit(renderer, steps=3)
    assert guarded == unguarded
    assert all(torch.equal(a, b) for a, b in zip(guarded_grads, unguarded_grads, strict=True))
    [event] = events  # three renders and backwards at one call site: one event
    assert event["action"] == "no_silhouette_gradient" and event["mode"] == "fix"
    assert event["target"] == PLACE
    assert "received a gradient" in event["event"] and "edges" in event["event"]
    assert (event["sigma"], event["blur_radius"], event["faces_per_pixel"]) == (1e-4, 0.0, 1)
    assert event["suggested_blur_radius"] == pytest.approx(TUTORIAL_BLUR)
    assert "blur_radius=0.000921" in event["remedy"] and "faces_per_pixel=50" in event["remedy"]
    path, line = event["callsite"].rsplit(":", 1)  # the render's line, not the backward's
    assert path == __file__ and "# the call site" in linecache.getline(path, int(line))


def test_one_event_per_render_call_site():
    autograd_guard.install({})
    renderer = silhouette_renderer(1e-4, 0.0, 1)
    R, T = look_at_view_transform(3.0, 30.0, 40.0)
    verts = ellipsoid().verts_packed().clone().requires_grad_()
    mesh = Meshes([verts], [ellipsoid().faces_packed()])
    with capture_events() as events:
        for _ in range(2):
            first = renderer(mesh, R=R, T=T)[..., 3]
            second = renderer(mesh, R=R, T=T)[..., 3]
            (first.sum() + second.sum()).backward()
    assert [e["action"] for e in events] == ["no_silhouette_gradient"] * 2
    assert events[0]["callsite"] != events[1]["callsite"]


def test_with_fragments_and_a_settings_override():
    autograd_guard.install({})
    renderer = silhouette_renderer(1e-4, TUTORIAL_BLUR, 50, MeshRendererWithFragments)
    hard = RasterizationSettings(image_size=64, blur_radius=0.0, faces_per_pixel=1)
    verts = ellipsoid().verts_packed().clone().requires_grad_()
    mesh = Meshes([verts], [ellipsoid().faces_packed()])
    R, T = look_at_view_transform(3.0, 30.0, 40.0)
    with capture_events() as events:
        images, fragments = renderer(mesh, R=R, T=T)
        assert images.requires_grad and fragments.pix_to_face.shape[-1] == 50
        images[..., 3].sum().backward()
        assert events == []
        images, fragments = renderer(mesh, R=R, T=T, raster_settings=hard)
        assert events == [] and fragments.pix_to_face.shape[-1] == 1
        images[..., 3].sum().backward()
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
    assert event["mode"] == "observe" and event["action"] == "no_silhouette_gradient"


def test_strict_raises_from_backward_before_the_camera_gets_a_gradient():
    autograd_guard.install("strict")
    renderer = silhouette_renderer(1e-4, 0.0, 1)
    mesh, target = ellipsoid(), reference()
    position = torch.tensor([3.0, 6.9, 2.5], requires_grad=True)
    R = look_at_rotation(position[None])
    T = -torch.bmm(R.transpose(1, 2), position[None, :, None])[:, :, 0]
    with capture_events() as events:
        image = renderer(mesh, R=R, T=T)  # no error yet: the settings bite in backward
        loss = ((image[..., 3] - target) ** 2).sum()
        with pytest.raises(autograd_guard.GuardError, match="pytorch3d_hard_silhouette") as raised:
            loss.backward()
    assert "received a gradient" in str(raised.value) and "faces_per_pixel=50" in str(raised.value)
    assert position.grad is None  # raised before any gradient reached the camera
    [event] = events
    assert event["level"] == "error" and event["callsite"].startswith(__file__)
    # the same object the guard raised, its traceback the user's frames, torch's, one of ours
    frames = [str(entry.path) for entry in raised.traceback]
    ours = [entry.name for entry in raised.traceback if "autograd_guard" in str(entry.path)]
    # one, and grad_health's loss check around Tensor.backward (a frame of its own: open)
    assert frames[0] == __file__ and len([n for n in ours if n != "backward"]) == 1
    camera_fit(silhouette_renderer(1e-4, TUTORIAL_BLUR, 50), steps=1)  # no raise


def metric_steps(use: str, steps: int = 2) -> tuple[list[float], list[torch.Tensor], list[float]]:
    """A grad-enabled training step on the tutorial's soft silhouette that also renders a
    hard one (blur_radius=0) for a metric, a mask or a picture: correct code."""
    mesh, target = ellipsoid(), reference()
    soft = silhouette_renderer(1e-4, TUTORIAL_BLUR, 50)
    hard = silhouette_renderer(1e-4, 0.0, 1)
    position = torch.tensor([3.0, 6.9, 2.5], requires_grad=True)
    optimizer = torch.optim.Adam([position], lr=0.2)
    losses, grads, metrics = [], [], []
    for _ in range(steps):
        optimizer.zero_grad()
        R = look_at_rotation(position[None])
        T = -torch.bmm(R.transpose(1, 2), position[None, :, None])[:, :, 0]
        alpha = soft(mesh, R=R, T=T)[..., 3]
        mask = hard(mesh, R=R, T=T)[..., 3]  # requires grad: the camera does
        assert mask.requires_grad
        loss = ((alpha - target) ** 2).sum()
        if use == "metric":  # an IoU logged, never in the loss
            inside = mask > 0.5
            metrics.append(
                ((inside & (target > 0.5)).sum() / (inside | (target > 0.5)).sum()).item()
            )
        elif use == "detached":  # a mask weighting the loss, detached
            loss = loss + (((alpha - target) ** 2) * mask.detach()).sum()
        elif use == "selected":  # pixels chosen by the hard mask (no gradient through it)
            loss = loss + alpha[mask > 0.5].sum()
        elif use == "zero":  # in the loss, but its gradient is all zero
            loss = loss + 0.0 * mask.sum()
        loss.backward()
        losses.append(loss.item())
        grads.append(position.grad.clone())
        optimizer.step()
    return losses, grads, metrics


USES = ["metric", "detached", "selected", "zero"]


@pytest.mark.parametrize("mode", ["fix", "observe", "strict"])
@pytest.mark.parametrize("use", USES)
def test_a_hard_silhouette_for_a_metric_in_a_training_step_is_silent(mode, use):
    expected = metric_steps(use)
    autograd_guard.install({"mode": mode})
    with capture_events() as events:
        got = metric_steps(use)
    assert events == []
    assert got[0] == expected[0] and got[2] == expected[2]
    assert all(torch.equal(a, b) for a, b in zip(got[1], expected[1], strict=True))
    assert got[1][0].abs().sum() > 0  # the soft silhouette trains the camera


@pytest.mark.filterwarnings("ignore:Dynamo does not know how to trace")  # PyTorch3D's _C
@pytest.mark.parametrize("compiled", ["caller", "renderer"])
def test_a_compiled_caller_still_works_and_is_named_in_backward(compiled):
    renderer = silhouette_renderer(1e-4, 0.0, 1)
    unguarded, unguarded_grads = camera_fit(renderer, steps=2)
    autograd_guard.install({})

    @torch.compile(backend="eager")
    def render(mesh, R, T):
        return renderer(mesh, R=R, T=T) * 1.0  # the call site, in the compiled caller

    torch._dynamo.reset()
    with capture_events() as events:
        if compiled == "caller":
            guarded, guarded_grads = camera_fit(render, steps=2)
        else:
            guarded, guarded_grads = camera_fit(torch.compile(renderer, backend="eager"), steps=2)
    assert guarded == unguarded
    assert all(torch.equal(a, b) for a, b in zip(guarded_grads, unguarded_grads, strict=True))
    [event] = events
    assert event["action"] == "no_silhouette_gradient" and event["callsite"].startswith(__file__)
    path, line = event["callsite"].rsplit(":", 1)
    assert "# the call site" in linecache.getline(path, int(line))


def test_uninstall_restores_the_original():
    autograd_guard.install({})
    assert module.MeshRenderer.forward.__wrapped__ is ORIGINAL
    autograd_guard.uninstall()
    assert module.MeshRenderer.forward is ORIGINAL
