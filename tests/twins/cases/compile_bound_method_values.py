"""A guarded method held as a value (``run = model.fit``), in a ``functools.partial`` and in
a callback list, called eagerly and inside ``torch.compile`` (eager backend) under
no_grad: each call gets grad, as the caller who wraps it in ``torch.enable_grad()`` gets
(one event per call site: the compiled call is logged at the same line)."""

import contextlib
import functools
import os

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:Fitter.fit"
        action = "enable_grad"
    """,
    "modes": {
        "fix": {"events": ["grad_mode/enable_grad"] * 3, "like": "handfix"},
        "observe": {"events": ["grad_mode/enable_grad"] * 3},
    },
}


class Fitter:
    def __init__(self):
        self.w = torch.linspace(0.5, 1.5, 3, requires_grad=True)

    def fit(self, x):
        return (x * self.w).sum()


def main():
    fitter = Fitter()
    run, bound, callbacks = fitter.fit, functools.partial(fitter.fit), [fitter.fit]

    def by_value(x):
        return run(x)

    def by_partial(x):
        return bound(x)

    def by_callbacks(x):
        return callbacks[0](x)

    x = torch.arange(3.0)
    for name, step in [("value", by_value), ("partial", by_partial), ("list", by_callbacks)]:
        hand = torch.enable_grad() if os.environ.get("TWIN_HANDFIX") else contextlib.nullcontext()
        with torch.no_grad(), hand:
            eager = step(x)
            compiled = torch.compile(step, backend="eager")(x)
        print(name, eager.item(), eager.requires_grad, compiled.item(), compiled.requires_grad)
        if compiled.requires_grad:
            compiled.backward()
    print(fitter.w.grad)
