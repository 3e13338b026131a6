"""grad_health's nonfinite_origin on PyTorch3D's known singular points: the event names
the library function and gives its specific advice (``advice``). These run on
PyTorch3D's Python code (transforms, ``corresponding_points_alignment``), with or without
its compiled extension."""

from __future__ import annotations

import pytorch3d  # noqa: F401  (conftest puts PyTorch3D on the path)
import torch
from pytorch3d.ops import corresponding_points_alignment
from pytorch3d.transforms import euler_angles_to_matrix, matrix_to_euler_angles, so3_relative_angle
from pytorch3d.transforms import rotation_conversions as rc

import autograd_guard
from autograd_guard.guards import BUILTIN
from autograd_guard.guards.pytorch3d_euler_gimbal import nonfinite_at_lock
from autograd_guard.testing import capture_events

CUBE = torch.tensor([[x, y, z] for x in (-1.0, 1.0) for y in (-1.0, 1.0) for z in (-1.0, 1.0)])


def train(param: torch.nn.Parameter, loss_of, steps: int = 3, policy=None):
    autograd_guard.install(policy or {})
    optimizer = torch.optim.SGD([param], lr=0.1)
    with capture_events() as events:
        for _ in range(steps):
            optimizer.zero_grad()
            loss = loss_of(param)
            loss.backward()
            optimizer.step()
    return [e for e in events if e["guard"] == "grad_health"], loss


def test_svd_of_a_symmetric_point_set_is_skipped_and_named_with_advice():
    """Case 5: R = I and a loss of 0, and a NaN gradient out of the SVD."""
    points = torch.nn.Parameter(CUBE[None].clone())

    def loss_of(x):
        fit = corresponding_points_alignment(x, CUBE[None])
        return ((fit.R - torch.eye(3)) ** 2).sum() + (fit.T**2).sum()

    skip = {"guards": {"grad_health": {"nonfinite_fix": "skip"}}}
    events, loss = train(points, loss_of, policy=skip)
    assert loss.item() == 0.0 and torch.equal(points.detach(), CUBE[None])  # every step skipped
    skipped, origin = events[:2]
    assert skipped["action"] == "nonfinite_gradient" and "skipped" in skipped["event"]
    assert origin["action"] == "nonfinite_origin" and origin["op"] == "LinalgSvdBackward0"
    assert origin["within"] == "pytorch3d.ops.points_alignment.corresponding_points_alignment"
    assert "repeated singular values" in origin["remedy"] and "jitter" in origin["remedy"]
    assert origin["forward"].endswith(".py:" + origin["forward"].rsplit(":", 1)[1])


def test_euler_angles_at_gimbal_lock_get_their_advice():
    gimbal = "pytorch3d_euler_gimbal"
    policy = {"disable": [gimbal]} if gimbal in BUILTIN else {}  # its remedy would mend it
    angles = torch.nn.Parameter(torch.tensor([0.3, torch.pi / 2, 0.2]))
    events, _ = train(
        angles,
        lambda a: matrix_to_euler_angles(euler_angles_to_matrix(a, "XYZ"), "XYZ").sum(),
        policy=policy,
    )
    if not nonfinite_at_lock(rc.matrix_to_euler_angles):  # torch 2.15: a finite gradient
        assert events == []
        return
    origin = next(e for e in events if e["action"] == "nonfinite_origin")
    assert origin["op"] in ("AsinBackward0", "Atan2Backward0")
    assert origin["within"].endswith("rotation_conversions.matrix_to_euler_angles")
    assert "gimbal lock" in origin["remedy"] and "quaternions" in origin["remedy"]


def test_so3_relative_angle_without_cos_bound_is_told_to_keep_it():
    rotation = torch.nn.Parameter(torch.eye(3)[None].clone())
    events, _ = train(
        rotation, lambda r: so3_relative_angle(r, torch.eye(3)[None], cos_bound=0).sum()
    )
    origin = next(e for e in events if e["action"] == "nonfinite_origin")
    assert origin["op"] == "AcosBackward0"
    assert origin["within"] == "pytorch3d.transforms.so3.so3_relative_angle"
    assert "cos_bound > 0" in origin["remedy"]


def test_an_acos_of_the_users_own_gets_the_general_advice():
    """The same op outside the library functions: no PyTorch3D advice."""
    x = torch.nn.Parameter(torch.ones(3))
    events, _ = train(x, lambda v: torch.acos(v).sum())
    origin = next(e for e in events if e["action"] == "nonfinite_origin")
    assert origin["op"] == "AcosBackward0" and "within" not in origin
    assert "epsilon" in origin["remedy"] and "pytorch3d" not in origin["remedy"]
