"""A soft distance transform of a sparse grid: log of a kernel sum that is exactly 0 far
from every occupied cell, clamped; log(0)'s backward is 0/0 on every step. fix skips two
steps, repairs LogBackward0 (its gradient there is 0, as the documented double
torch.where gives) and ends at the reference's centres."""

import os

import torch

TWIN = {
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
    }
}


def main():
    torch.manual_seed(0)
    axis = torch.arange(24) * 1.0
    grid = torch.stack(torch.meshgrid(axis, axis, indexing="ij"), -1).reshape(-1, 2)
    centres = torch.nn.Parameter(torch.tensor([[3.0, 4.0], [6.0, 5.0]]))
    target = torch.tensor([[12.0, 12.0], [14.0, 9.0]])
    goal = (torch.cdist(grid, target) ** 2).min(1).values.clamp(max=36.0)
    optimizer = torch.optim.Adam([centres], lr=0.3)
    for _ in range(300):
        kernel = torch.exp(-(torch.cdist(grid, centres) ** 2) / 0.5).sum(1)
        if os.environ.get("TWIN_HANDFIX"):
            safe = torch.where(kernel > 0, kernel, torch.ones_like(kernel))
            log = torch.where(kernel > 0, torch.log(safe), torch.full_like(kernel, -100.0))
        else:
            log = torch.log(kernel).clamp(min=-100.0)
        loss = ((-0.5 * log).clamp(max=36.0) - goal).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("loss below 1e-3:", loss.item() < 1e-3)
    print("centres:", [round(c, 1) for c in centres.detach().flatten().tolist()])
