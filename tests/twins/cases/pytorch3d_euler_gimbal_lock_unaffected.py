"""Orientations fitted through ``matrix_to_euler_angles`` with one starting exactly at gimbal
lock, where this torch's gradient there is finite (2.15: clamp's backward is 0 at its
bounds): nothing to remedy, so in every mode the guard stays out of the way: PyTorch3D's
own call, the same losses and orientations bit for bit, and no event."""

import math

import pytorch3d_without_extension  # noqa: F401
import torch
from pytorch3d.transforms import matrix_to_euler_angles, quaternion_to_matrix

TWIN = {
    "libraries": ["pytorch3d"],
    "requires": ["no_pytorch3d_euler_gimbal_bug"],  # torch up to 2.13: see ..._pose_fit
    "modes": ["fix", "observe", "strict"],
}


def main():
    torch.manual_seed(1)
    half = math.sqrt(0.5)  # a quarter turn about Y: pitch 90 degrees
    orientations = torch.tensor([[half, 0.0, half, 0.0], [1.0, 0.0, 0.0, 0.0]])
    orientations = orientations + 0.1 * torch.randn(2, 4) * torch.tensor([[0.0], [1.0]])
    orientations.requires_grad_()
    goal = torch.tensor([[0.1, 1.2, -0.1], [0.3, -0.2, 0.4]])
    optimizer = torch.optim.SGD([orientations], lr=0.05)
    history = []
    for _ in range(4):
        optimizer.zero_grad()
        euler = matrix_to_euler_angles(quaternion_to_matrix(orientations), "XYZ")
        error = (euler - goal).abs().sum()
        error.backward()
        history.append(round(error.item(), 6))
        optimizer.step()
    print(history, bool(torch.isfinite(orientations).all()))
    torch.save({"orientations": orientations.detach(), "history": history}, "result.pt")
