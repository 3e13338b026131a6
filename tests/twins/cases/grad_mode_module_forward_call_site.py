"""Issue 19 item 13: a rule on ``Refiner.forward``, reached through ``nn.Module.__call__``;
the event names the line of ``refiner(x)``, not torch's ``module.py``."""

import os

import torch
from torch import nn

TWIN = {
    "policy": """
        [[rules]]
        target = "case:Refiner.forward"
        action = "enable_grad"
    """,
    "modes": {"fix": {"events": ["grad_mode/enable_grad"], "like": "handfix"}},
}


class Refiner(nn.Module):
    def __init__(self):
        super().__init__()
        self.offset = nn.Parameter(torch.zeros(3))

    def forward(self, x):
        residual = ((x + self.offset) ** 2).sum()
        (grad,) = torch.autograd.grad(residual, self.offset)
        return x - 0.5 * grad


def main():
    refiner = Refiner()
    x = torch.tensor([1.0, 2.0, 3.0])
    with torch.no_grad():
        if os.environ.get("TWIN_HANDFIX"):
            with torch.enable_grad():
                y = refiner(x)
        else:
            y = refiner(x)
    print(y.tolist())
