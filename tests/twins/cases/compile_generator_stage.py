"""A generator stage: with grad on inside ``torch.compile`` (traced into the graph as
unguarded, nothing logged), then consumed eagerly under no_grad (each resume gets grad)."""

import contextlib
import os

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:halves"
        action = "enable_grad"
    """,
    "modes": {"fix": {"events": ["grad_mode/enable_grad"], "like": "handfix"}},
}


def halves(x):
    yield x * 0.5
    yield x * 0.25


def total(x):
    return sum(halves(x.sin())).cos().sum()


def main():
    w = torch.linspace(0, 1, 4, requires_grad=True)
    out = torch.compile(total, backend="eager")(w)
    out.backward()
    print(out.item(), w.grad.tolist())
    hand = torch.enable_grad() if os.environ.get("TWIN_HANDFIX") else contextlib.nullcontext()
    with torch.no_grad(), hand:
        parts = list(halves(w))
    print([p.requires_grad for p in parts])
