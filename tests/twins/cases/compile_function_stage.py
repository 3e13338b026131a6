"""``torch.compile`` (eager backend) of a train step that calls a guarded stage with grad
on: the same values and gradients, nothing logged."""

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:stage"
        action = "enable_grad"
        [[rules]]
        target = "case:scale"
        action = "snapshot"
    """,
    "modes": ["fix", "strict"],
}


def stage(x, w):
    return (x * w).sum()


def scale(x):
    return x * 3


def step(x, w):
    return stage(scale(x), w) * 2


def main():
    w = torch.linspace(0, 1, 5, requires_grad=True)
    compiled = torch.compile(step, backend="eager")
    loss = compiled(torch.ones(5), w)
    loss.backward()
    full = torch.compile(step, backend="eager", fullgraph=True)
    print(loss.item(), full(torch.ones(5), w).item(), w.grad.tolist())
