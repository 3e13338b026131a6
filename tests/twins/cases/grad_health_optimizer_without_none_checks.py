"""A hand-written optimizer that reads every ``p.grad`` without a None check and counts its
steps in ``param_groups`` and in an attribute: a skipped NaN step never runs its body, so
nothing crashes and neither counter moves, as skipping the call by hand does.

Hiding the gradients from the optimizer (``p.grad = None`` while it steps) is not a skip for
such a class: ``p.add_(None, ...)`` raises, and the counters would move anyway.
"""

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


class CountingSGD(torch.optim.Optimizer):
    """As written in many research repositories: no ``p.grad is None`` check anywhere."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr, "step": 0})
        self.steps = 0

    @torch.no_grad()
    def step(self, closure=None):
        self.steps += 1
        for group in self.param_groups:
            group["step"] += 1
            for p in group["params"]:
                p.add_(p.grad, alpha=-group["lr"])
                state = self.state[p]
                state["updates"] = state.get("updates", 0) + 1


def all_finite(parameters):
    return all(torch.isfinite(p.grad).all() for p in parameters if p.grad is not None)


def main():
    torch.manual_seed(0)
    model = nn.Linear(3, 3)
    optimizer = CountingSGD(model.parameters(), lr=0.1)
    for step in range(8):
        optimizer.zero_grad()
        out = model(torch.rand(5, 3) + 0.5)
        # At steps 3 and 4 the target is the output itself: the distance is an exact zero.
        target = out.detach() if step in (3, 4) else torch.zeros_like(out)
        loss = (out - target).pow(2).sum(-1).sqrt().mean()
        loss.backward()
        if os.environ.get("TWIN_HANDFIX") and not all_finite(model.parameters()):
            optimizer.zero_grad()
            continue
        optimizer.step()
    print("steps taken:", optimizer.steps, [g["step"] for g in optimizer.param_groups])
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "param_groups": [dict(group) for group in optimizer.param_groups],
            "steps": optimizer.steps,
        },
        "result.pt",
    )
