"""``torch.compile`` (inductor) of a call to a guarded method stage, made under no_grad:
the remedy is traced into the graph, as ``torch.enable_grad()`` inside would be."""

import os

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:Fitter.run"
        action = "enable_grad"
    """,
    "modes": {"fix": {"events": ["grad_mode/enable_grad"], "like": "handfix"}},
}


class Fitter:
    def run(self, x, w):
        return (x * w).sum()


def main():
    fitter = Fitter()

    def step(x, w):
        if os.environ.get("TWIN_HANDFIX"):
            with torch.enable_grad():
                return fitter.run(x, w)
        return fitter.run(x, w)

    w = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        loss = torch.compile(step)(torch.arange(3.0), w)
    print("requires grad:", loss.requires_grad)
    if loss.requires_grad:
        loss.backward()
    print(w.grad)
