"""A user's ``torch.autograd.Function`` whose backward has the wrong sign: the gradient is
finite, so nothing else notices, and the fit walks away from its target (a few small
steps here, before it overflows). grad_audit
compares the real backward with a finite difference of the forward at the Function's first
call and names it (``wrong_gradient``); it never changes a gradient, so fix and observe run
exactly as unguarded, and strict stops the run at that first backward."""

import torch

TWIN = {
    "requires": ["grad_audit_on"],
    "modes": {
        "fix": {"events": ["grad_audit/wrong_gradient"]},
        "observe": {"events": ["grad_audit/wrong_gradient"]},
        "strict": {
            "events": ["grad_audit/wrong_gradient"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x**3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return -3 * x**2 * grad  # the bug: the sign


def main():
    torch.manual_seed(0)
    w = torch.randn(6, requires_grad=True)
    target = torch.randn(6)
    optimizer = torch.optim.SGD([w], lr=0.001)
    for _ in range(5):
        optimizer.zero_grad()
        loss = (Cube.apply(w) - target).pow(2).sum()
        loss.backward()
        optimizer.step()
    torch.save({"w": w.detach()}, "result.pt")
