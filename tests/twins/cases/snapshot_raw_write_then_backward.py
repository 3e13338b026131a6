"""Issue 19 item 2: a kernel writes into its input through NumPy (a raw pointer, invisible
to autograd); a ``data`` snapshot rule restores the bytes, and the caller's graph, which
saved that input before the call, still runs backward."""

import os

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:splat"
        action = "snapshot"
        check = "data"
    """,
    "modes": {
        "fix": {"events": ["snapshot_inputs/input_modified"], "like": "handfix"},
        "observe": {"events": ["snapshot_inputs/input_modified"]},
        "strict": {
            "events": ["snapshot_inputs/input_modified"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


def splat(points):
    scratch = points.numpy()  # shares memory: written without autograd knowing
    scratch *= 2.0
    return float(scratch.sum())


def main():
    weight = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    points = torch.tensor([1.0, 2.0, 3.0])
    energy = (weight * points).sum()  # saves points for backward
    total = splat(points.clone() if os.environ.get("TWIN_HANDFIX") else points)
    energy.backward()
    print("total", total, "points", points.tolist())
    torch.save({"grad": weight.grad, "points": points}, "result.pt")
