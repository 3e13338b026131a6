"""``torch.compile`` (inductor) of a step that calls a guarded method stage, called under
no_grad: the stage gets grad, as calling the compiled step under ``torch.enable_grad()``
gives it (an ``enable_grad()`` inside the compiled step would not do on torch < 2.5,
which compiles a graph entered without grad for inference)."""

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
        return fitter.run(x, w)

    w = torch.ones(3, requires_grad=True)
    compiled = torch.compile(step)
    with torch.no_grad():
        if os.environ.get("TWIN_HANDFIX"):
            with torch.enable_grad():
                loss = compiled(torch.arange(3.0), w)
        else:
            loss = compiled(torch.arange(3.0), w)
    print("requires grad:", loss.requires_grad)
    if loss.requires_grad:
        loss.backward()
    print(loss.item(), w.grad)
