"""A rotation fit from the identity (the usual start) with RoMa 1.2.1's rotvec_to_rotmat,
which divides the rotation vector by its norm before its small-angle branch: 0/0 in the
forward pass at the identity, a NaN gradient. fix skips two steps, repairs the division
(one step: the fit then leaves the identity) and ends where RoMa's own quaternion path,
the manual fix (rotvec_to_unitquat, then unitquat_to_rotmat), ends; RoMa 1.3.0, the
fixed release, ends there too (tests/test_grad_health_repair.py)."""

import os

import roma
import torch

TWIN = {
    "libraries": ["roma-1.2.1"],
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
    points = torch.randn(32, 3)
    target = points @ roma.rotvec_to_rotmat(torch.tensor([0.4, -0.3, 0.6])).T
    rotvec = torch.nn.Parameter(torch.zeros(3))  # the identity
    optimizer = torch.optim.Adam([rotvec], lr=0.05)
    for _ in range(150):
        if os.environ.get("TWIN_HANDFIX"):
            rotation = roma.unitquat_to_rotmat(roma.rotvec_to_unitquat(rotvec))
        else:
            rotation = roma.rotvec_to_rotmat(rotvec)
        loss = (points @ rotation.T - target).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("loss:", round(loss.item(), 4))
    print("rotation:", [round(r, 3) for r in rotvec.detach().tolist()])
