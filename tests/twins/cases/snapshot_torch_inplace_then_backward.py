"""A helper writes into its input with a torch in-place op after the caller's graph saved
it: backward fails "modified by an inplace operation" unguarded, and still does after the
guard restores the values (the version counter moved; the event says so)."""

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:normalise"
        action = "snapshot"
        check = "data"
    """,
    "modes": {
        "fix": {"events": ["snapshot_inputs/input_modified"]},
        "observe": {"events": ["snapshot_inputs/input_modified"]},
        "strict": {
            "events": ["snapshot_inputs/input_modified"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


def normalise(points):
    points.div_(points.norm())
    return points.mean()


def main():
    weight = torch.tensor([1.0, 2.0], requires_grad=True)
    points = torch.tensor([3.0, 4.0])
    energy = (weight * points).sum()
    normalise(points)
    try:
        energy.backward()
    except RuntimeError as exc:
        print("backward failed:", "modified by an inplace operation" in str(exc))
    print(weight.grad)
