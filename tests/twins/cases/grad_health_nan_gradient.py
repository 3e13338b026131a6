"""``sqrt`` of an exact zero: a finite forward, a NaN/Inf gradient that would poison the
weights; the guard skips those steps (weights and Adam's state untouched), as skipping
them by hand does, and names the parameter."""

import os

import torch
from torch import nn

TWIN = {
    "modes": {
        "fix": {
            "events": [
                "grad_health/nonfinite_gradient",
                "grad_health/nonfinite_origin",
                "grad_health/steps_skipped",
            ],
            "like": "handfix",
        },
        "observe": {
            "events": [
                "grad_health/nonfinite_gradient",
                "grad_health/nonfinite_loss",
                "grad_health/nonfinite_origin",
                "grad_health/nonfinite_origin",
            ],
        },
        "strict": {
            "events": ["grad_health/nonfinite_gradient", "grad_health/nonfinite_origin"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


def all_finite(parameters):
    return all(torch.isfinite(p.grad).all() for p in parameters if p.grad is not None)


def main():
    torch.manual_seed(0)
    model = nn.Linear(3, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    for step in range(8):
        optimizer.zero_grad()
        out = model(torch.rand(5, 3) + 0.5)
        # At steps 3 and 4 the target is the output itself: the distance is an exact zero.
        target = out.detach() if step in (3, 4) else torch.zeros_like(out)
        loss = (out - target).pow(2).sum(-1).sqrt().mean()
        loss.backward()
        if os.environ.get("TWIN_HANDFIX") and not all_finite(model.parameters()):
            continue
        optimizer.step()
    finite = all(torch.isfinite(p).all().item() for p in model.parameters())
    print("weights finite:", finite)
    torch.save({"model": model.state_dict(), "adam": optimizer.state_dict()}, "result.pt")
