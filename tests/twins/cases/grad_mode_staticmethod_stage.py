"""A ``staticmethod`` stage, called through the class and through an instance."""

import os

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:Solver.solve"
        action = "enable_grad"
    """,
    "modes": {"fix": {"events": ["grad_mode/enable_grad"], "like": "handfix"}},
}


class Solver:
    @staticmethod
    def solve(target):
        x = torch.zeros_like(target, requires_grad=True)
        ((x - target) ** 2).sum().backward()
        return (x - 0.5 * x.grad).detach()


def main():
    torch.set_grad_enabled(False)
    target = torch.tensor([3.0, -1.0])
    if os.environ.get("TWIN_HANDFIX"):
        with torch.enable_grad():
            results = [Solver.solve(target), Solver().solve(target)]
    else:
        results = [Solver.solve(target), Solver().solve(target)]
    print([r.tolist() for r in results])
