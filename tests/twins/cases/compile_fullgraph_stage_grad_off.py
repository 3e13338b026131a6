"""A guarded stage called under no_grad from ``torch.compile(..., fullgraph=True)`` with
inductor and with the eager backend. The hand fix is an ``enable_grad`` around the call
inside the compiled function: torch < 2.5 compiles an inductor graph entered without grad
for inference, so there neither the hand fix nor the guard can give the stage grad, and
the guard says so instead of claiming a fix."""

import contextlib
import os

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:Fitter.run"
        action = "enable_grad"
    """,
    "modes": {
        "fix": {
            "events": ["grad_mode/enable_grad"],
            "maybe": ["grad_mode/compiled_unguarded"],  # torch < 2.5: inductor
            "like": "handfix",
        },
        "strict": {
            "events": ["grad_mode/enable_grad"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


class Fitter:
    def run(self, x, w):
        return (x * w).sum()


def main():
    fitter = Fitter()
    hand = os.environ.get("TWIN_HANDFIX")

    def step(x, w):
        with torch.enable_grad() if hand else contextlib.nullcontext():
            return fitter.run(x, w)

    w = torch.ones(3, requires_grad=True)
    for backend in ("eager", "inductor"):
        with torch.no_grad():
            loss = torch.compile(step, backend=backend, fullgraph=True)(torch.arange(3.0), w)
        print(backend, loss.item(), loss.requires_grad)
        if loss.requires_grad:
            loss.backward()
    print(w.grad)
