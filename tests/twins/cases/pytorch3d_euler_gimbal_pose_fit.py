"""A pose fit through ``matrix_to_euler_angles`` whose first camera starts looking straight
down (pitch 90 degrees, gimbal lock): the middle angle's asin has an infinite derivative
there, the gradient is NaN and Adam writes NaN into every pose; the guard's finite
derivative equals that remedy applied by hand (same forward, finite gradient). Where this
torch's gradient at the lock is finite (2.15) there is nothing to remedy: see
pytorch3d_euler_gimbal_lock_unaffected."""

import math
import os

import pytorch3d_without_extension  # noqa: F401
import torch
from pytorch3d.transforms import matrix_to_euler_angles, quaternion_to_matrix

TWIN = {
    "libraries": ["pytorch3d"],
    "requires": ["pytorch3d_euler_gimbal_bug"],  # torch 2.15: the gradient is finite
    "modes": {
        "fix": {"events": ["pytorch3d_euler_gimbal/finite_gradient"], "like": "handfix"},
        "observe": {
            "events": [
                "pytorch3d_euler_gimbal/finite_gradient",
                "grad_health/nonfinite_gradient",
                "grad_health/nonfinite_loss",
                "grad_health/nonfinite_origin",
                "grad_health/nonfinite_origin",
            ]
        },
        "strict": {
            "events": ["pytorch3d_euler_gimbal/finite_gradient"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


def to_euler(matrix):
    if os.environ.get("TWIN_HANDFIX"):
        from autograd_guard.guards.pytorch3d_euler_gimbal import matrix_to_euler_angles as fixed

        return fixed(matrix, "XYZ")
    return matrix_to_euler_angles(matrix, "XYZ")


def main():
    torch.manual_seed(0)
    poses = torch.nn.functional.normalize(torch.randn(6, 4), dim=-1)
    poses[0] = torch.tensor([math.cos(math.pi / 4), 0.0, math.sin(math.pi / 4), 0.0])
    poses.requires_grad_()
    target = torch.randn(6, 3) * 0.5
    optimizer = torch.optim.Adam([poses], lr=0.02)
    for step in range(5):
        optimizer.zero_grad()
        angles = to_euler(quaternion_to_matrix(poses))
        loss = ((angles - target) ** 2).mean()
        loss.backward()
        optimizer.step()
        print(step, f"{loss.item():.6f}", bool(torch.isfinite(poses).all()))
    torch.save({"poses": poses.detach(), "adam": optimizer.state_dict()}, "result.pt")
