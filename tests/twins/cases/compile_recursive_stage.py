"""A recursive stage (a tree of partial sums) called under no_grad, eagerly and inside
``torch.compile`` (eager backend): every level gets grad, as under ``enable_grad()``."""

import contextlib
import os

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:tree_sum"
        action = "enable_grad"
    """,
    "modes": {
        "fix": {"events": ["grad_mode/enable_grad"] * 2, "like": "handfix"},
        "strict": {
            "events": ["grad_mode/enable_grad"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


def tree_sum(x, depth):
    if depth == 0:
        return (x * x).sum()
    half = x.shape[0] // 2
    return tree_sum(x[:half], depth - 1) + tree_sum(x[half:], depth - 1)


def main():
    w = torch.linspace(-1, 1, 16, requires_grad=True)
    hand = torch.enable_grad() if os.environ.get("TWIN_HANDFIX") else contextlib.nullcontext()
    with torch.no_grad(), hand:
        eager = tree_sum(w, 3)
    print("eager", eager.item(), eager.requires_grad)
    compiled = torch.compile(tree_sum, backend="eager")
    with torch.no_grad(), hand:
        out = compiled(w, 3)
    print("compiled", out.item(), out.requires_grad)
    if out.requires_grad:
        out.backward()
    print(w.grad)
