"""Guard pytorch3d_euler_gimbal against PyTorch3D's real ``matrix_to_euler_angles``
(pure Python: these tests need no ``pytorch3d._C`` and run in every cell).

``BUG``: the library's gradient at gimbal lock is not finite with this torch (up to 2.13;
torch 2.15's clamp backward gives 0 at its bounds). Where it is, the tests show the NaN
and the remedy; where it is not, that the guard stays out of the way."""

from __future__ import annotations

import itertools
import math

import pytest
import pytorch3d.transforms
import torch
from helpers import assert_attached
from pytorch3d.transforms import euler_angles_to_matrix, quaternion_to_matrix
from pytorch3d.transforms import rotation_conversions as rc

import autograd_guard
from autograd_guard.guards.pytorch3d_euler_gimbal import matrix_to_euler_angles as remedy
from autograd_guard.guards.pytorch3d_euler_gimbal import nonfinite_at_lock
from autograd_guard.testing import capture_events

ORIGINAL = rc.matrix_to_euler_angles
PLACE = "pytorch3d.transforms:matrix_to_euler_angles"
TAIT_BRYAN = ["".join(p) for p in itertools.permutations("XYZ")]
PROPER = [a + b + a for a, b in itertools.permutations("XYZ", 2)]
BOUND = 1 / math.sqrt(torch.finfo(torch.float32).eps)  # the derivative's cap at +-1
BUG = nonfinite_at_lock(ORIGINAL)


def at_lock(convention: str) -> torch.Tensor:
    """A rotation whose middle angle is 90 degrees (Tait-Bryan) or 0 (proper Euler)."""
    middle = math.pi / 2 if convention[0] != convention[2] else 0.0
    return euler_angles_to_matrix(torch.tensor([0.3, middle, -0.2]), convention)


def exact_lock(convention: str) -> torch.Tensor:
    """The lock with the other two angles 0, rounded: entries exactly 0 and +-1, so that the
    first and third angles are atan2(0, 0)."""
    middle = math.pi / 2 if convention[0] != convention[2] else 0.0
    return euler_angles_to_matrix(torch.tensor([0.0, middle, 0.0]), convention).round()


def random_rotations(n: int = 500) -> torch.Tensor:
    torch.manual_seed(0)
    return quaternion_to_matrix(torch.nn.functional.normalize(torch.randn(n, 4), dim=-1))


def fit_poses(steps: int = 60) -> tuple[list[float], int, torch.Tensor]:
    """An ordinary pose fit: 8 camera orientations (quaternions) regressed onto target
    Euler angles with Adam; the first camera starts looking straight down (pitch 90)."""
    torch.manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(8, 4), dim=-1)
    q[0] = torch.tensor([math.cos(math.pi / 4), 0.0, math.sin(math.pi / 4), 0.0])
    q.requires_grad_()
    target = torch.randn(8, 3) * 0.5
    optimizer = torch.optim.Adam([q], lr=0.02)
    losses, nonfinite = [], 0
    for _ in range(steps):
        optimizer.zero_grad()
        angles = pytorch3d.transforms.matrix_to_euler_angles(quaternion_to_matrix(q), "XYZ")
        loss = ((angles - target) ** 2).mean()
        loss.backward()
        losses.append(loss.item())
        nonfinite += int(not torch.isfinite(q.grad).all())
        optimizer.step()
    return losses, nonfinite, q.detach()


def lock_gradients_of_torch_ops() -> tuple[float, float]:
    """What the library's two ops give at the lock: clamp then asin at 1, atan2 at (0, 0)."""
    one, zero = torch.ones((), requires_grad=True), torch.zeros((), requires_grad=True)
    (asin,) = torch.autograd.grad(torch.asin(torch.clamp(one, -1.0, 1.0)), one)
    (atan2,) = torch.autograd.grad(torch.atan2(zero, zero * 0), zero)
    return asin.item(), atan2.item()


def test_the_probe_says_what_torch_does():
    asin, atan2 = lock_gradients_of_torch_ops()
    assert (not math.isfinite(asin) or not math.isfinite(atan2)) == BUG
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) <= (2, 13):
        assert BUG and asin == math.inf  # the pinned cell (2.13) and every older one
    assert nonfinite_at_lock(ORIGINAL) is BUG  # remembered


@pytest.mark.parametrize("convention", TAIT_BRYAN + PROPER)
def test_unguarded_gradient_at_gimbal_lock(convention):
    matrix = at_lock(convention).requires_grad_()
    angles = ORIGINAL(matrix, convention)
    assert torch.isfinite(angles).all()  # the forward is fine
    node = angles.grad_fn.next_functions[1][0]  # what made the middle angle
    assert type(node).__name__ == ("AsinBackward0" if convention in TAIT_BRYAN else "AcosBackward0")
    (grad,) = torch.autograd.grad(angles[1], matrix)
    assert bool(torch.isfinite(grad).all()) is not BUG  # torch 2.15: 0 through the clamp


@pytest.mark.parametrize("convention", TAIT_BRYAN + PROPER)
def test_remedy_is_finite_and_bounded_at_lock_with_the_same_forward(convention):
    matrix = at_lock(convention).requires_grad_()
    ours, theirs = remedy(matrix, convention), ORIGINAL(matrix, convention)
    assert torch.equal(ours, theirs)
    (grad,) = torch.autograd.grad(ours.sum(), matrix, retain_graph=True)
    assert torch.isfinite(grad).all()
    (middle,) = torch.autograd.grad(ours[1], matrix)
    # 0 where torch's clamp gives 0 at its bound (the library's own gradient there).
    assert middle.abs().max().item() == (pytest.approx(BOUND, rel=1e-6) if BUG else 0.0)


@pytest.mark.parametrize("convention", TAIT_BRYAN + PROPER)
def test_remedy_is_finite_with_exact_zeros_beside_the_lock(convention):
    # An exact rotation at the lock: the first and third angles are atan2(0, 0), whose
    # gradient torch before 2.13 makes NaN; the remedy's is 0 (torch 2.13's).
    matrix = exact_lock(convention).requires_grad_()
    ours = remedy(matrix, convention)
    assert torch.equal(ours, ORIGINAL(matrix, convention))
    (grad,) = torch.autograd.grad(ours.sum(), matrix)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_and_gradient_bit_identical_away_from_lock(dtype):
    matrices = random_rotations().to(dtype)
    weights = torch.randn(len(matrices), 3, dtype=dtype)
    for convention in TAIT_BRYAN + PROPER:
        grads, values = [], []
        for function in (ORIGINAL, remedy):
            matrix = matrices.clone().requires_grad_()
            angles = function(matrix, convention)
            (angles * weights).sum().backward()
            values.append(angles.detach())
            grads.append(matrix.grad)
        assert torch.equal(values[0], values[1]), convention
        assert torch.equal(grads[0], grads[1]), convention


def test_euler_angles_to_matrix_needs_no_guard():
    # The other direction is sin and cos: finite gradients at the lock and everywhere.
    for convention in TAIT_BRYAN + PROPER:
        middle = math.pi / 2 if convention[0] != convention[2] else 0.0
        angles = torch.tensor([0.3, middle, -0.2], requires_grad=True)
        (grad,) = torch.autograd.grad(euler_angles_to_matrix(angles, convention).sum(), angles)
        assert torch.isfinite(grad).all()


def test_pose_fit_stalls_under_grad_health_and_moves_guarded():
    losses, nonfinite, poses = fit_poses()
    if not BUG:  # torch 2.15: finite and trains unguarded; the guard changes nothing
        assert nonfinite == 0 and losses[-1] < 0.2 * losses[0]
        autograd_guard.install({})
        with capture_events() as events:
            guarded = fit_poses()
        assert [e for e in events if e["guard"] == "pytorch3d_euler_gimbal"] == []
        assert guarded[0] == losses and torch.equal(guarded[2], poses)
        return
    # Unguarded, every step's gradient is NaN and Adam writes NaN into the poses.
    assert nonfinite == 60 and not torch.isfinite(poses).all()
    # grad_health alone skips each such step: finite, but the poses never move.
    skip = {"grad_health": {"nonfinite_fix": "skip"}}  # skip, not repair at the origin
    autograd_guard.install({"disable": ["pytorch3d_euler_gimbal"], "guards": skip})
    with capture_events() as events:
        losses, nonfinite, poses = fit_poses()
    assert nonfinite == 60 and len(set(losses)) == 1
    assert {e["action"] for e in events} >= {"nonfinite_gradient", "training_stalled"}
    # Guarded: finite gradients, and the loss goes down.
    autograd_guard.install({})
    with capture_events() as events:
        losses, nonfinite, poses = fit_poses()
    assert nonfinite == 0 and torch.isfinite(poses).all()
    assert losses[-1] < 0.2 * losses[0]
    [event] = events
    assert (event["guard"], event["action"]) == ("pytorch3d_euler_gimbal", "finite_gradient")
    assert event["rotations_at_lock"] == 1 and event["rotations"] == 8
    assert event["callsite"].endswith(f"test_pytorch3d_euler_gimbal.py:{_fit_line()}")


def _fit_line() -> int:
    import inspect

    lines, start = inspect.getsourcelines(fit_poses)
    return start + next(i for i, line in enumerate(lines) if "matrix_to_euler_angles(" in line)


def test_silent_on_correct_code():
    autograd_guard.install({})
    assert_attached("pytorch3d_euler_gimbal", PLACE)
    matrices = random_rotations(64).requires_grad_()
    with capture_events() as events:
        for convention in TAIT_BRYAN + PROPER:
            angles = pytorch3d.transforms.matrix_to_euler_angles(matrices, convention)
            angles.sum().backward()
            # At the lock without grad, or with grad off: nothing to do.
            pytorch3d.transforms.matrix_to_euler_angles(at_lock(convention), convention)
            with torch.no_grad():
                pytorch3d.transforms.matrix_to_euler_angles(
                    at_lock(convention).requires_grad_(), convention
                )
    assert events == []
    assert torch.isfinite(matrices.grad).all()


def test_library_errors_pass_through_unchanged():
    autograd_guard.install({})
    matrix = at_lock("XYZ").requires_grad_()
    for convention, message in (("XXY", "Invalid convention"), ("XYW", "Invalid letter")):
        with pytest.raises(ValueError, match=message):
            pytorch3d.transforms.matrix_to_euler_angles(matrix, convention)
    with pytest.raises(ValueError, match="Invalid rotation matrix shape"):
        pytorch3d.transforms.matrix_to_euler_angles(torch.ones(4, 4, requires_grad=True), "XYZ")


def test_at_the_lock_an_event_only_where_the_gradient_is_not_finite():
    autograd_guard.install({})
    for convention in TAIT_BRYAN + PROPER:
        for exact in (False, True):
            matrix = exact_lock(convention) if exact else at_lock(convention)
            theirs = torch.autograd.grad(
                ORIGINAL(matrix.requires_grad_(), convention).sum(), matrix
            )
            with capture_events() as events:
                angles = pytorch3d.transforms.matrix_to_euler_angles(matrix, convention)
            (ours,) = torch.autograd.grad(angles.sum(), matrix)
            assert len(events) == int(BUG), convention
            if BUG:
                assert torch.isfinite(ours).all() and not torch.isfinite(theirs[0]).all()
            else:  # out of the way: the library's own call, its gradient bit for bit
                assert torch.equal(ours, theirs[0]), convention


def test_observe_names_it_and_changes_nothing():
    autograd_guard.install({"mode": "observe"})
    matrix = at_lock("ZYX").requires_grad_()
    with capture_events() as events:
        angles = pytorch3d.transforms.matrix_to_euler_angles(matrix, "ZYX")
    (grad,) = torch.autograd.grad(angles[1], matrix)
    assert bool(torch.isfinite(grad).all()) is not BUG
    if not BUG:
        assert events == []
        return
    [event] = events
    assert event["action"] == "finite_gradient" and event["mode"] == "observe"
    assert "asin" in event["event"] and event["convention"] == "ZYX"


def test_strict_raises_at_the_lock():
    autograd_guard.install("strict")
    matrix = at_lock("ZYZ").requires_grad_()
    if BUG:
        with pytest.raises(autograd_guard.GuardError, match=r"pytorch3d_euler_gimbal.*acos"):
            pytorch3d.transforms.matrix_to_euler_angles(matrix, "ZYZ")
    else:
        angles = pytorch3d.transforms.matrix_to_euler_angles(matrix, "ZYZ")
        assert torch.equal(angles, ORIGINAL(matrix, "ZYZ"))
    away = random_rotations(4).requires_grad_()
    pytorch3d.transforms.matrix_to_euler_angles(away, "ZYZ").sum().backward()  # no raise


def test_uninstall_restores_the_original():
    autograd_guard.install({})
    assert pytorch3d.transforms.matrix_to_euler_angles.__wrapped__ is ORIGINAL
    autograd_guard.uninstall()
    assert pytorch3d.transforms.matrix_to_euler_angles is rc.matrix_to_euler_angles is ORIGINAL


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_at_the_lock_rotation_parameters_get_clean_gradients_a_leaf_matrix_huge(dtype):
    # The realistic path: angles or a quaternion are the parameters; their gradient through
    # the remedy is small. A leaf matrix at the lock gets a finite but huge one from the
    # outer angles' atan2 near (0, 0) (1e16 in float64): no longer a skipped step, but one
    # that may jump.
    q = torch.tensor([math.cos(math.pi / 4), 0, math.sin(math.pi / 4), 0], dtype=dtype)
    angles = torch.tensor([0.3, math.pi / 2, -0.2], dtype=dtype)
    for parameter, rotation in ((q, quaternion_to_matrix), (angles, _xyz)):
        parameter = parameter.clone().requires_grad_()
        (grad,) = torch.autograd.grad(remedy(rotation(parameter), "XYZ").sum(), parameter)
        assert torch.isfinite(grad).all() and grad.abs().max() <= 1.0 + 1e-6
    matrix = euler_angles_to_matrix(torch.tensor([0, math.pi / 2, 0], dtype=dtype), "XYZ")
    (grad,) = torch.autograd.grad(remedy(matrix.requires_grad_(), "XYZ").sum(), matrix)
    assert torch.isfinite(grad).all() and grad.abs().max() > 1e6


def _xyz(angles: torch.Tensor) -> torch.Tensor:
    return euler_angles_to_matrix(angles, "XYZ")


def library_grad(matrices: torch.Tensor, convention: str) -> torch.Tensor:
    matrices = matrices.clone().requires_grad_()
    return torch.autograd.grad(ORIGINAL(matrices, convention).sum(), matrices)[0]


@pytest.mark.parametrize("mode", ["fix", "observe", "strict"])
def test_under_vmap_silent_and_the_librarys_gradient(mode):
    # torch.func.vmap makes the count at the lock unreadable: the library's own behaviour,
    # no event, no guard error, far from the lock and at it.
    autograd_guard.install({"mode": mode})
    grad = torch.func.grad(lambda m: pytorch3d.transforms.matrix_to_euler_angles(m, "XYZ").sum())
    away, lock = random_rotations(2), torch.stack((at_lock("XYZ"), random_rotations(1)[0]))
    with capture_events() as events:
        ours = [torch.func.vmap(grad)(m) for m in (away, lock)]
    assert events == []
    theirs = [library_grad(m, "XYZ") for m in (away, lock)]
    assert torch.allclose(ours[0], theirs[0])
    assert bool(torch.isfinite(ours[1]).all()) is not BUG


def test_under_func_grad_the_remedy_works_then_the_event():
    autograd_guard.install({})
    function = torch.func.grad(lambda m: pytorch3d.transforms.matrix_to_euler_angles(m, "ZYX")[1])
    with capture_events() as events:
        away = random_rotations(1)[0]
        assert torch.equal(function(away), torch.func.grad(lambda m: ORIGINAL(m, "ZYX")[1])(away))
        assert events == []
        grad = function(at_lock("ZYX"))
    assert torch.isfinite(grad).all()
    assert [e["action"] for e in events] == (["finite_gradient"] if BUG else [])
    if BUG:
        assert "non-finite: inf or NaN" in events[0]["event"]
