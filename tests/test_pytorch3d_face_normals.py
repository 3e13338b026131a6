"""Guard pytorch3d_face_normals against PyTorch3D's compiled mesh_face_areas_normals.

Needs the real ``pytorch3d._C`` (``nox -s py3.11-torch2.12.0-pytorch3d``, or
``AUTOGRAD_GUARD_TEST_PYTORCH3D=installed`` in an environment with easypytorch3d's
wheel); skipped where only PyTorch3D's Python code is installed.
"""

from __future__ import annotations

import importlib
import json

import pytest
import torch

pytest.importorskip("pytorch3d._C")

import pytorch3d.ops
from helpers import assert_attached, run_python
from pytorch3d.ops import sample_points_from_meshes
from pytorch3d.structures import Meshes
from pytorch3d.utils import ico_sphere

import autograd_guard
from autograd_guard.guards.pytorch3d_face_normals import face_areas_normals
from autograd_guard.testing import capture_events

# pytorch3d.ops.mesh_face_areas_normals is the function there: the module from sys.modules
module = importlib.import_module("pytorch3d.ops.mesh_face_areas_normals")
ORIGINAL = module.mesh_face_areas_normals
PLACE = "pytorch3d.ops.mesh_face_areas_normals:mesh_face_areas_normals"


def noisy_sphere(level: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(level)
    mesh = ico_sphere(level)
    verts = mesh.verts_packed()
    return (verts + 0.05 * torch.randn_like(verts)).double(), mesh.faces_packed()


def loss_of(function, verts, faces, weights):
    """A loss on the normals and the areas, as a normal-consistency or shading term."""
    areas, normals = function(verts, faces)
    return (normals.double() * weights[0]).sum() + (areas.double() * weights[1]).sum()


def weights_for(faces: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(7)
    count = faces.shape[0]
    return torch.randn(count, 3, dtype=torch.float64), torch.randn(count, dtype=torch.float64)


def gradient(function, verts, faces, weights) -> torch.Tensor:
    verts = verts.clone().requires_grad_()
    loss_of(function, verts, faces, weights).backward()
    return verts.grad


def finite_differences(function, verts, faces, weights, eps: float) -> torch.Tensor:
    """Central differences of ``function``'s own forward, entry by entry."""
    grad = torch.zeros_like(verts)
    with torch.no_grad():
        for index in range(verts.numel()):
            step = torch.zeros_like(verts).view(-1)
            step[index] = eps
            plus = loss_of(function, verts + step.view_as(verts), faces, weights)
            minus = loss_of(function, verts - step.view_as(verts), faces, weights)
            grad.view(-1)[index] = (plus - minus) / (2 * eps)
    return grad


def float64_maths(verts, faces):
    """The same maths in float64 (no float32 cast), for a reference gradient."""
    v0, v1, v2 = verts[faces].unbind(1)
    cross = torch.cross(v1 - v0, v2 - v0, dim=1)
    norm = cross.norm(dim=1)
    return norm / 2, cross / norm.clamp(min=1e-6).unsqueeze(1)


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value - reference).norm() / reference.norm())


def test_the_compiled_backward_is_wrong_through_the_normals():
    verts, faces = noisy_sphere()
    weights = weights_for(faces)
    theirs = gradient(ORIGINAL, verts, faces, weights)
    # float32 forward: differences of 1e-3 resolve the gradient to ~1e-4
    measured = finite_differences(ORIGINAL, verts, faces, weights, 1e-3)
    reference = gradient(float64_maths, verts, faces, weights)
    assert relative_error(measured, reference) < 1e-3  # the forward is right
    assert relative_error(theirs, measured) > 0.1  # its gradient is not
    assert relative_error(theirs[:, :2], measured[:, :2]) < 1e-3  # only z is off
    areas_only = (torch.zeros_like(weights[0]), weights[1])
    # PyTorch3D's own test back-propagates the areas only: right there
    assert (
        relative_error(
            gradient(ORIGINAL, verts, faces, areas_only), reference_areas(verts, faces, areas_only)
        )
        < 1e-5
    )


def reference_areas(verts, faces, weights):
    return gradient(float64_maths, verts, faces, weights)


def test_the_plain_torch_path_has_the_right_gradient_and_the_same_forward():
    verts, faces = noisy_sphere(2)
    weights = weights_for(faces)
    ours = gradient(face_areas_normals, verts, faces, weights)
    assert relative_error(ours, gradient(float64_maths, verts, faces, weights)) < 1e-6
    measured = finite_differences(float64_maths, verts, faces, weights, 1e-6)
    assert relative_error(ours, measured) < 1e-6
    for level in range(4):
        verts, faces = noisy_sphere(level)
        for dtype in (torch.float32, torch.float64, torch.float16):
            theirs, mine = (
                ORIGINAL(verts.to(dtype), faces),
                face_areas_normals(verts.to(dtype), faces),
            )
            assert all(torch.equal(t, m) for t, m in zip(theirs, mine, strict=True))


def test_degenerate_faces_get_finite_gradients():
    verts = torch.tensor([[0.0, 0, 0], [1, 0, 0], [2, 0, 0], [0, 1e-8, 0]], requires_grad=True)
    faces = torch.tensor([[0, 1, 2], [0, 1, 3], [0, 0, 0]])
    areas, normals = face_areas_normals(verts, faces)
    theirs = ORIGINAL(verts.detach(), faces)
    assert torch.equal(areas, theirs[0]) and torch.equal(normals, theirs[1])
    (areas.sum() + normals.sum()).backward()
    assert torch.isfinite(verts.grad).all()


def test_twice_differentiable():
    verts, faces = noisy_sphere(1)
    weights = weights_for(faces)
    direction = torch.randn_like(verts)
    products = []
    for function in (face_areas_normals, float64_maths):
        v = verts.clone().requires_grad_()
        (grad,) = torch.autograd.grad(loss_of(function, v, faces, weights), v, create_graph=True)
        (hessian_direction,) = torch.autograd.grad((grad * direction).sum(), v)
        products.append(hessian_direction)
    assert relative_error(products[0], products[1]) < 1e-4  # float32 against float64


def test_guarded_meshes_get_the_right_gradient_and_the_same_values(monkeypatch):
    verts, faces = noisy_sphere(1)
    weights = weights_for(faces)
    reference = gradient(float64_maths, verts, faces, weights)
    unguarded = ORIGINAL(verts, faces)
    autograd_guard.install()
    assert_attached("pytorch3d_face_normals", PLACE)
    entered = []
    kernel = module._C.face_areas_normals_backward
    monkeypatch.setattr(module._C, "face_areas_normals_backward", _spy(kernel, entered))
    v = verts.clone().requires_grad_()
    mesh = Meshes(verts=[v], faces=[faces])
    with capture_events() as events:
        normals, areas = mesh.faces_normals_packed(), mesh.faces_areas_packed()
        assert events == []  # said in backward(), where the normals get their gradient
        ((normals.double() * weights[0]).sum() + (areas.double() * weights[1]).sum()).backward()
    assert relative_error(v.grad, reference) < 1e-6
    assert torch.equal(areas, unguarded[0]) and torch.equal(normals, unguarded[1])
    # the areas' gradient is the library's backward, given a zero gradient for its normals
    [grad_normals] = entered
    assert grad_normals.shape == normals.shape and not grad_normals.any()
    [event] = events
    assert event["action"] == "redirect" and event["faces"] == faces.shape[0]
    assert "normals was corrected" in event["event"]
    assert event["target"] == PLACE and event["version"] == "0.7.9.post1"
    assert event["callsite"].startswith(__file__)
    assert event["dtype"] == "torch.float64" and event["device"] == "cpu"


def test_one_event_per_call_site_and_every_entry_point_is_guarded():
    verts, faces = noisy_sphere(1)
    autograd_guard.install()
    assert pytorch3d.ops.mesh_face_areas_normals is module.mesh_face_areas_normals
    assert module.mesh_face_areas_normals.__wrapped__ is ORIGINAL
    with capture_events() as events:
        for _ in range(3):
            pytorch3d.ops.mesh_face_areas_normals(verts.clone().requires_grad_(), faces)[
                1
            ].sum().backward()
        module.mesh_face_areas_normals(verts.clone().requires_grad_(), faces)[1].sum().backward()
    assert [e["action"] for e in events] == ["redirect", "redirect"]  # two lines, two events
    assert events[0]["callsite"] != events[1]["callsite"]
    assert all(e["callsite"].startswith(__file__) for e in events)  # the forward's lines


@pytest.mark.parametrize("mode", ["fix", "strict"])
def test_calls_without_a_gradient_run_the_library_silently(mode, monkeypatch):
    autograd_guard.install({"mode": mode})
    assert_attached("pytorch3d_face_normals", PLACE)
    entered = []
    kernel = module._C.face_areas_normals_forward
    monkeypatch.setattr(module._C, "face_areas_normals_forward", _spy(kernel, entered))
    verts, faces = noisy_sphere(1)
    with capture_events() as events:
        pytorch3d.ops.mesh_face_areas_normals(verts, faces)  # no grad needed
        with torch.no_grad():
            pytorch3d.ops.mesh_face_areas_normals(verts.clone().requires_grad_(), faces)
        with torch.inference_mode():
            pytorch3d.ops.mesh_face_areas_normals(verts.clone().requires_grad_(), faces)
        Meshes(verts=[verts], faces=[faces]).faces_normals_packed()
        mesh = Meshes(verts=[verts.float().requires_grad_()], faces=[faces])
        sample_points_from_meshes(mesh, 100)  # its areas under no_grad
    assert len(entered) == 5 and events == []


def test_bad_input_gets_the_library_s_own_errors():
    autograd_guard.install()
    verts, faces = noisy_sphere(1)
    with capture_events() as events:
        for bad in (verts[:, :2], verts.flatten()):
            with pytest.raises(ValueError, match="verts need to be of shape Vx3"):
                pytorch3d.ops.mesh_face_areas_normals(bad.clone().requires_grad_(), faces)
        with pytest.raises(ValueError, match=r"faces need to be of type torch\.int64"):
            pytorch3d.ops.mesh_face_areas_normals(verts.clone().requires_grad_(), faces.int())
        # autograd.Function.apply takes no keywords, guarded or not
        with pytest.raises(TypeError, match="apply\\(\\) takes no keyword arguments"):
            pytorch3d.ops.mesh_face_areas_normals(verts=verts.clone().requires_grad_(), faces=faces)
    assert events == []


def test_strict_raises_from_backward_where_the_normals_get_a_gradient(monkeypatch):
    autograd_guard.install("strict")
    entered = []
    kernel = module._C.face_areas_normals_backward
    monkeypatch.setattr(module._C, "face_areas_normals_backward", _spy(kernel, entered))
    verts, faces = noisy_sphere(1)
    v = verts.clone().requires_grad_()
    mesh = Meshes(verts=[v], faces=[faces])
    with capture_events() as events:
        normals = mesh.faces_normals_packed()  # no error yet: the bug bites in backward
        loss = normals.sum() + mesh.faces_areas_packed().sum()
        with pytest.raises(autograd_guard.GuardError, match="pytorch3d_face_normals") as raised:
            loss.backward()
    assert "normals received a gradient" in str(raised.value)
    assert v.grad is None  # no gradient reached the vertices
    # the library's backward (the areas', if it ran) never sees the normals' gradient
    assert all(not grad_normals.any() for grad_normals in entered)
    [event] = events
    assert event["level"] == "error" and event["callsite"].startswith(__file__)
    # the same object the guard raised, its traceback the user's frames, torch's, one of ours
    frames = [str(entry.path) for entry in raised.traceback]
    ours = [entry.name for entry in raised.traceback if "autograd_guard" in str(entry.path)]
    # one, and grad_health's loss check around Tensor.backward (a frame of its own: open)
    assert frames[0] == __file__ and len([n for n in ours if n != "backward"]) == 1


def test_observe_names_the_call_and_changes_nothing():
    verts, faces = noisy_sphere(1)
    weights = weights_for(faces)
    unguarded = gradient(ORIGINAL, verts, faces, weights)
    autograd_guard.install("observe")
    with capture_events() as events:
        observed = gradient(pytorch3d.ops.mesh_face_areas_normals, verts, faces, weights)
    assert torch.equal(observed, unguarded)
    assert [e["action"] for e in events] == ["redirect"] and events[0]["mode"] == "observe"
    assert "normals received a gradient" in events[0]["event"]


def areas_only_uses(verts, faces):
    """Correct code: the normals get no gradient (or an all-zero one); the areas' is right."""
    areas, normals = pytorch3d.ops.mesh_face_areas_normals(verts, faces)
    yield areas.sum()
    areas, normals = pytorch3d.ops.mesh_face_areas_normals(verts, faces)
    yield areas.sum() + (normals.detach() ** 2).sum()  # normals used without grad
    areas, normals = pytorch3d.ops.mesh_face_areas_normals(verts, faces)
    yield areas.sum() + (normals * 0).sum()  # an all-zero gradient
    mesh = Meshes(verts=[verts], faces=[faces])
    mesh.faces_normals_packed()  # computed alongside, never used
    yield mesh.faces_areas_packed().pow(2).sum()


@pytest.mark.parametrize("mode", ["fix", "observe", "strict"])
def test_areas_only_is_silent_with_the_library_s_gradient(mode):
    verts, faces = noisy_sphere(2)
    v = verts.clone().requires_grad_()
    expected = [torch.autograd.grad(loss, v)[0] for loss in areas_only_uses(v, faces)]
    autograd_guard.install({"mode": mode})
    with capture_events() as events:
        v = verts.clone().requires_grad_()
        got = [torch.autograd.grad(loss, v)[0] for loss in areas_only_uses(v, faces)]
    assert events == []
    for ours, theirs in zip(got, expected, strict=True):  # the library's own backward
        assert torch.equal(ours, theirs) and ours.abs().sum() > 0


def test_twice_differentiable_when_guarded():
    """The normals are twice differentiable; the areas, the library's, only once, as
    unguarded (its backward is ``once_differentiable``: a gradient without a graph)."""
    verts, faces = noisy_sphere(1)
    normals_only = (weights_for(faces)[0], torch.zeros(faces.shape[0], dtype=torch.float64))
    direction = torch.randn_like(verts)
    v = verts.clone().requires_grad_()
    (grad,) = torch.autograd.grad(
        loss_of(float64_maths, v, faces, normals_only), v, create_graph=True
    )
    (expected,) = torch.autograd.grad((grad * direction).sum(), v)
    (areas_grad,) = torch.autograd.grad(ORIGINAL(v, faces)[0].sum(), v, create_graph=True)
    assert areas_grad.grad_fn is None and not areas_grad.requires_grad  # unguarded
    autograd_guard.install()
    with capture_events() as events:
        loss = loss_of(pytorch3d.ops.mesh_face_areas_normals, v, faces, normals_only)
        (grad,) = torch.autograd.grad(loss, v, create_graph=True)
        (hessian_direction,) = torch.autograd.grad((grad * direction).sum(), v)
        areas = pytorch3d.ops.mesh_face_areas_normals(v, faces)[0]
        (guarded_areas_grad,) = torch.autograd.grad(areas.sum(), v, create_graph=True)
    assert relative_error(hessian_direction, expected) < 1e-4  # float32 against float64
    assert [e["action"] for e in events] == ["redirect"]
    assert torch.equal(guarded_areas_grad, areas_grad) and not guarded_areas_grad.requires_grad


def test_a_compiled_caller_gets_the_fixed_gradient():
    verts, faces = noisy_sphere(1)
    weights = weights_for(faces)
    reference = gradient(float64_maths, verts, faces, weights)
    autograd_guard.install()

    @torch.compile(backend="eager")
    def loss(v):
        return loss_of(pytorch3d.ops.mesh_face_areas_normals, v, faces, weights)

    torch._dynamo.reset()
    with capture_events() as events:
        for _ in range(2):
            v = verts.clone().requires_grad_()
            loss(v).backward()
            assert relative_error(v.grad, reference) < 1e-6
    assert [e["action"] for e in events] == ["redirect"]


def test_uninstall_restores_the_library():
    autograd_guard.install()
    assert module.mesh_face_areas_normals is not ORIGINAL
    autograd_guard.uninstall()
    assert module.mesh_face_areas_normals is ORIGINAL
    assert pytorch3d.ops.mesh_face_areas_normals is ORIGINAL
    assert sample_points_from_meshes.__globals__["mesh_face_areas_normals"] is ORIGINAL


def test_vertex_normals_are_plain_torch_and_right_unguarded():
    """``verts_normals_packed`` computes its own cross products: not affected."""
    verts, faces = noisy_sphere(1)
    weights = torch.randn(verts.shape, dtype=torch.float64)

    def vertex_normals(v, f):
        normals = Meshes(verts=[v], faces=[f]).verts_normals_packed()
        return torch.zeros(1, dtype=v.dtype), normals

    theirs = gradient(vertex_normals, verts, faces, (weights, torch.zeros(1)))
    measured = finite_differences(vertex_normals, verts, faces, (weights, torch.zeros(1)), 1e-6)
    assert relative_error(theirs, measured) < 1e-6


FIT = """
import json, torch
from pytorch3d.structures import Meshes
from pytorch3d.utils import ico_sphere

torch.manual_seed(0)
sphere = ico_sphere(1)
faces = sphere.faces_packed()
target = Meshes([sphere.verts_packed() * torch.tensor([1.0, 1.0, 0.5])], [faces])
target_normals = target.faces_normals_packed()
verts = (sphere.verts_packed() + 0.05 * torch.randn(42, 3)).requires_grad_()
optimizer = torch.optim.Adam([verts], lr=1e-2)
errors = []
for step in range(5):
    optimizer.zero_grad()
    normals = Meshes([verts], [faces]).faces_normals_packed()
    loss = (1 - (normals * target_normals).sum(1)).mean()
    loss.backward()
    v = verts.detach().double().requires_grad_()
    a, b, c = v[faces].unbind(1)
    cross = torch.cross(b - a, c - a, dim=1)
    exact = cross / cross.norm(dim=1, keepdim=True).clamp(min=1e-6)
    (1 - (exact * target_normals.double()).sum(1)).mean().backward()
    errors.append(float((verts.grad - v.grad).norm() / v.grad.norm()))
    optimizer.step()
print(json.dumps(errors))
"""


def test_an_optimizer_loop_through_the_pth(guard_python, tmp_path):
    unguarded = run_python(guard_python, FIT, tmp_path)
    guarded = run_python(guard_python, FIT, tmp_path, AUTOGRAD_GUARD="1")
    assert min(json.loads(unguarded.stdout)) > 0.05
    assert max(json.loads(guarded.stdout)) < 1e-5
    assert "[pytorch3d_face_normals/redirect]" not in unguarded.stderr
    assert guarded.stderr.count("[pytorch3d_face_normals/redirect]") == 1


def _spy(function, calls):
    """``function``, noting its second argument (the normals' gradient in backward)."""

    def spy(*args, **kwargs):
        calls.append(args[1])
        return function(*args, **kwargs)

    return spy
