"""Issue 19 item 6: a generator stage under a ``functools.wraps`` decorator is a generator
too; the fix must apply at each resume, and no fix may be logged that did not happen."""

import functools
import os

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:refine"
        action = "enable_grad"
    """,
    "modes": {
        "fix": {"events": ["grad_mode/enable_grad"], "like": "handfix"},
        "strict": {
            "events": ["grad_mode/enable_grad"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


def traced(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        print("calling", function.__name__)
        return function(*args, **kwargs)

    return wrapper


@traced
def refine(values):
    for value in values:
        weight = torch.ones(1, requires_grad=True)
        (weight * value).sum().backward()
        yield weight.grad.item()


def main():
    torch.set_grad_enabled(False)
    values = [1.0, 2.5, -4.0]
    if os.environ.get("TWIN_HANDFIX"):
        with torch.enable_grad():
            print(list(refine(values)))
    else:
        print(list(refine(values)))
