"""A rotation fit from the identity with PyTorch3D's rotation angle as a regulariser,
computed with cos_bound=0: acos unbounded, -0/0 in its backward at the identity. fix
skips two steps, repairs AcosBackward0 and ends where the default cos_bound (1e-4) ends."""

import os

import torch
from pytorch3d.transforms import so3_exp_map, so3_rotation_angle

TWIN = {
    "libraries": ["pytorch3d"],
    "modes": {
        "fix": {
            "events": [
                "grad_health/nonfinite_gradient",
                "grad_health/nonfinite_repaired",
                "grad_health/nonfinite_origin",
                "grad_health/steps_repaired",
                "grad_health/steps_skipped",
            ],
            "like": "handfix",
        }
    },
}


def main():
    torch.manual_seed(0)
    points = torch.randn(20, 3)
    target = points @ so3_exp_map(torch.tensor([[0.3, -0.2, 0.5]]))[0].T
    log_rotation = torch.nn.Parameter(torch.zeros(1, 3))
    optimizer = torch.optim.Adam([log_rotation], lr=0.05)
    bound = 1e-4 if os.environ.get("TWIN_HANDFIX") else 0.0
    for _ in range(150):
        rotation = so3_exp_map(log_rotation)
        angle = so3_rotation_angle(rotation, cos_bound=bound)
        loss = (points @ rotation[0].T - target).pow(2).mean() + 0.01 * angle.pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("loss:", round(loss.item(), 3))
    print("rotation:", [round(r, 2) for r in log_rotation.detach().flatten().tolist()])
