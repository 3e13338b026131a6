"""Guard pytorch3d_taubin against PyTorch3D's real Python code (0.7.9, no extension)."""

from __future__ import annotations

import inspect

import pytest
import pytorch3d
import pytorch3d.ops
import torch
from helpers import assert_attached
from pytorch3d.ops import mesh_filtering
from pytorch3d.structures import Meshes, join_meshes_as_batch
from pytorch3d.utils import ico_sphere

import autograd_guard
from autograd_guard.taubin import taubin_smooth_verts, taubin_smoothing
from autograd_guard.testing import capture_events

ORIGINAL = mesh_filtering.taubin_smoothing
PLACE = "pytorch3d.ops:taubin_smoothing"  # where the tests call it


@pytest.fixture
def guard():
    autograd_guard.install()
    yield
    autograd_guard.uninstall()


def noisy_batch() -> Meshes:
    torch.manual_seed(0)
    meshes = [ico_sphere(1), ico_sphere(2), ico_sphere(3)]  # different sizes
    return Meshes(
        verts=[m.verts_packed() + 0.05 * torch.randn_like(m.verts_packed()) for m in meshes],
        faces=[m.faces_packed() for m in meshes],
    )


def test_forward_matches_pytorch3d_on_single_and_batched_meshes():
    for meshes in (ico_sphere(3), noisy_batch()):
        theirs, ours = ORIGINAL(meshes), taubin_smoothing(meshes)
        assert isinstance(ours, Meshes) and len(ours) == len(meshes)
        assert torch.equal(ours.faces_packed(), theirs.faces_packed())
        assert torch.allclose(ours.verts_packed(), theirs.verts_packed(), atol=1e-5)
        assert ours.num_verts_per_mesh().tolist() == theirs.num_verts_per_mesh().tolist()


def test_gradcheck_float64_and_twice_differentiable():
    mesh = noisy_batch()
    verts = mesh.verts_packed()[:42].double().requires_grad_()
    edges = ico_sphere(1).edges_packed()
    assert torch.autograd.gradcheck(lambda v: taubin_smooth_verts(v, edges, num_iter=2), (verts,))
    assert torch.autograd.gradgradcheck(
        lambda v: taubin_smooth_verts(v, edges, num_iter=1), (verts,)
    )


def test_gradient_equals_pytorch3d_gradient():
    mesh = noisy_batch()
    weights = torch.randn(mesh.verts_packed().shape)
    grads = []
    for function in (ORIGINAL, taubin_smoothing):
        verts = mesh.verts_packed().clone().requires_grad_()
        meshes = Meshes(
            verts=list(verts.split(mesh.num_verts_per_mesh().tolist())), faces=mesh.faces_list()
        )
        (function(meshes, num_iter=3).verts_packed() * weights).sum().backward()
        grads.append(verts.grad)
    assert torch.allclose(grads[0], grads[1], atol=5e-4)  # float32 rounding of two sum orders


def test_requires_grad_is_redirected(guard):
    verts = ico_sphere(3).verts_packed().clone().requires_grad_()
    meshes = Meshes(verts=[verts], faces=[ico_sphere(3).faces_packed()])
    with capture_events() as events:
        out = pytorch3d.ops.taubin_smoothing(meshes)
    out.verts_packed().sum().backward()
    assert verts.grad is not None and torch.isfinite(verts.grad).all()
    [event] = events
    assert event["action"] == "redirect" and event["vertices"] == 642
    assert event["target"] == "pytorch3d.ops.mesh_filtering:taubin_smoothing"
    assert event["version"] == "0.7.9.post1"


def test_float64_fails_unguarded_and_works_guarded():
    mesh = ico_sphere(2)
    meshes = Meshes(verts=[mesh.verts_packed().double()], faces=[mesh.faces_packed()])
    with pytest.raises(RuntimeError, match="Float but found Double"):
        pytorch3d.ops.taubin_smoothing(meshes)
    autograd_guard.install()
    with capture_events() as events:
        out = pytorch3d.ops.taubin_smoothing(meshes)
    assert out.verts_packed().dtype == torch.float64
    assert torch.allclose(out.verts_packed().float(), ORIGINAL(mesh).verts_packed(), atol=1e-5)
    assert "float64" in events[0]["event"]


def test_no_grad_float32_stays_on_pytorch3d(guard, monkeypatch):
    assert_attached("pytorch3d_taubin", PLACE)
    entered = []
    monkeypatch.setattr(
        mesh_filtering, "norm_laplacian", _spy(mesh_filtering.norm_laplacian, entered)
    )
    with capture_events() as events:
        out = pytorch3d.ops.taubin_smoothing(ico_sphere(2))
    assert entered and events == []
    assert torch.equal(out.verts_packed(), ORIGINAL(ico_sphere(2)).verts_packed())


def test_strict_raises_before_the_sparse_path(monkeypatch):
    entered = []
    monkeypatch.setattr(
        mesh_filtering, "norm_laplacian", _spy(mesh_filtering.norm_laplacian, entered)
    )
    autograd_guard.install("strict")
    verts = ico_sphere(2).verts_packed().clone().requires_grad_()
    with pytest.raises(autograd_guard.GuardError, match="pytorch3d_taubin"):
        pytorch3d.ops.taubin_smoothing(Meshes(verts=[verts], faces=[ico_sphere(2).faces_packed()]))
    assert entered == []


def test_reactive_fallback_on_the_old_torch_error(guard, monkeypatch):
    # Stand-in for torch 1.12 (pytorch3d#1804), which cannot be installed beside torch 2.13:
    # the sparse path raises the error message that old torch raised.
    def old_torch_norm_laplacian(*args, **kwargs):
        raise RuntimeError(
            "The backward pass for this operation requires the 'self' tensor "
            "to be strided, but a sparse tensor was given instead."
        )

    monkeypatch.setattr(mesh_filtering, "norm_laplacian", old_torch_norm_laplacian)
    with capture_events() as events:
        out = pytorch3d.ops.taubin_smoothing(ico_sphere(2))
    assert torch.allclose(out.verts_packed(), taubin_smoothing(ico_sphere(2)).verts_packed())
    assert events[0]["action"] == "fallback"


def test_reexport_is_wrapped_with_the_same_signature(guard):
    assert pytorch3d.ops.taubin_smoothing is mesh_filtering.taubin_smoothing
    assert mesh_filtering.taubin_smoothing.__wrapped__ is ORIGINAL
    assert inspect.signature(pytorch3d.ops.taubin_smoothing) == inspect.signature(ORIGINAL)
    autograd_guard.uninstall()
    assert pytorch3d.ops.taubin_smoothing is mesh_filtering.taubin_smoothing is ORIGINAL


def test_pytorch3d_own_taubin_test_passes_guarded(guard):
    # pytorch3d/tests/test_mesh_filtering.py: three ico_sphere(4), noise where z > 0,
    # 50 iterations; the smoothed mesh is closer to the sphere than the noisy one.
    torch.manual_seed(1)
    N = 3
    mesh = ico_sphere(4).extend(N)
    verts = mesh.verts_packed()
    noise = 0.2 * torch.randn_like(verts) * (verts[:, 2:] > 0)
    noisy_verts = (verts + noise).requires_grad_()  # with grad: the guarded path
    noisy = Meshes(
        verts=list(noisy_verts.split(mesh.num_verts_per_mesh().tolist())), faces=mesh.faces_list()
    )
    with capture_events() as events:
        smooth = pytorch3d.ops.taubin_smoothing(noisy, num_iter=50)
    smooth.verts_packed().sum().backward()
    noisy_error = (noisy_verts.detach().norm(dim=1) - 1).abs().mean()
    smooth_error = (smooth.verts_packed().detach().norm(dim=1) - 1).abs().mean()
    assert smooth_error < noisy_error
    assert events[0]["action"] == "redirect" and events[0]["meshes"] == N


def _spy(function, calls):
    def spy(*args, **kwargs):
        calls.append(1)
        return function(*args, **kwargs)

    return spy


def test_join_meshes_batch_matches():
    batch = join_meshes_as_batch([ico_sphere(1), ico_sphere(2)])
    assert torch.allclose(
        taubin_smoothing(batch).verts_packed(), ORIGINAL(batch).verts_packed(), atol=1e-5
    )


def test_the_guarded_function_pickles_copies_and_cloudpickles_as_the_original(guard):
    import copy
    import pickle

    import cloudpickle
    from pytorch3d import ops

    guarded = ops.taubin_smoothing
    assert guarded is not ORIGINAL and guarded.__wrapped__ is ORIGINAL
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(guarded, protocol)) is guarded
    assert pickle.loads(cloudpickle.dumps(guarded)) is guarded
    assert copy.copy(guarded) is guarded and copy.deepcopy(guarded) is guarded
    assert copy.deepcopy({"smooth": mesh_filtering.taubin_smoothing})["smooth"] is guarded


@pytest.mark.parametrize("mode", ["fix", "strict"])
def test_calls_that_pytorch3d_handles_itself_are_silent(mode):
    """No grad and float32: PyTorch3D's own path works, and the guard stays out of it."""
    autograd_guard.install({"mode": mode})
    assert_attached("pytorch3d_taubin", PLACE)
    with capture_events() as events:
        pytorch3d.ops.taubin_smoothing(ico_sphere(2))
        with torch.no_grad():
            pytorch3d.ops.taubin_smoothing(ico_sphere(2).offset_verts(torch.zeros(162, 3)))
    assert [e for e in events if e["action"] != "late_patch"] == []
