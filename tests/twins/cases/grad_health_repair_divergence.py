"""A divergence is never repaired: the loss itself overflows to inf from the start (a
learning rate far too high would do the same). Every step stays skipped, as a hand-written
``if not finite: continue`` skips it, and the stall is said."""

import os

import torch

TWIN = {
    "modes": {
        "fix": {
            "events": [
                "grad_health/nonfinite_gradient",
                "grad_health/nonfinite_loss",
                "grad_health/nonfinite_origin",
                "grad_health/nonfinite_origin",
                "grad_health/training_stalled",
                "grad_health/steps_skipped",
            ],
            "like": "handfix",
        }
    }
}


def main():
    w = torch.nn.Parameter(torch.full((4,), 1e30))
    optimizer = torch.optim.SGD([w], lr=0.1)
    for _ in range(25):
        loss = (w * w).sum() * 1e10  # inf
        optimizer.zero_grad()
        loss.backward()
        if os.environ.get("TWIN_HANDFIX") and not torch.isfinite(w.grad).all():
            continue
        optimizer.step()
    print("weights:", w.tolist())
    torch.save({"w": w.detach()}, "result.pt")
