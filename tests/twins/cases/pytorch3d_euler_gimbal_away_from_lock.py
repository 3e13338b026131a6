"""Correct code: ``matrix_to_euler_angles`` in a pose fit far from gimbal lock, then at the
lock without grad (an evaluation): nothing risky, PyTorch3D's own angles and gradients,
bit for bit, and no event."""

import math

import pytorch3d_without_extension  # noqa: F401
import torch
from pytorch3d.transforms import euler_angles_to_matrix, matrix_to_euler_angles

TWIN = {"libraries": ["pytorch3d"], "modes": ["fix", "strict"]}


def main():
    torch.manual_seed(0)
    angles = (torch.rand(6, 3) - 0.5).requires_grad_()  # pitch within 30 degrees of level
    target = torch.randn(6, 3) * 0.3
    optimizer = torch.optim.SGD([angles], lr=0.1)
    for _ in range(5):
        optimizer.zero_grad()
        recovered = matrix_to_euler_angles(euler_angles_to_matrix(angles, "ZYX"), "ZYX")
        loss = ((recovered - target) ** 2).sum()
        loss.backward()
        optimizer.step()
    with torch.no_grad():  # straight down, evaluated only
        down = euler_angles_to_matrix(torch.tensor([0.3, math.pi / 2, -0.2]), "XYZ")
        at_lock = matrix_to_euler_angles(down, "XYZ")
    print(f"{loss.item():.6f}", at_lock.tolist())
    torch.save({"angles": angles.detach(), "grad": angles.grad, "at_lock": at_lock}, "result.pt")
