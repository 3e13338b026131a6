"""Issue 19 item 3: a guarded function marked ``@torch.jit.ignore`` and called from scripted
code stays ignored (run in Python), and ``torch.jit.ignore(f)`` works, as unguarded."""

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:helper"
        action = "enable_grad"
        [[rules]]
        target = "case:other"
        action = "enable_grad"
    """,
}


@torch.jit.ignore
def helper(x: torch.Tensor) -> float:
    return float(x.numpy().sum())  # not scriptable: must stay in Python


def other(x: torch.Tensor) -> float:
    return float(x.numpy().max())


def caller(x: torch.Tensor) -> float:
    return helper(x) + 1.0


def main():
    print(torch.jit.script(caller)(torch.ones(3)))
    ignored = torch.jit.ignore(other)
    print(ignored(torch.arange(4.0)))
