"""A guarded stage run under ``torch.utils.checkpoint`` (re-run in backward) and inside a
custom ``autograd.Function``: the same values and gradients, nothing logged."""

import torch
from torch.utils.checkpoint import checkpoint

TWIN = {
    "policy": """
        [[rules]]
        target = "case:block"
        action = "enable_grad"
        [[rules]]
        target = "case:kernel"
        action = "snapshot"
        check = "data"
    """,
    "modes": ["fix"],
}


def block(x, w):
    return torch.sin(x @ w).sum(-1)


def kernel(x):
    return x.exp()


class Exp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = kernel(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y


def main():
    torch.manual_seed(0)
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(3, 3, requires_grad=True)
    out = checkpoint(block, x, w, use_reentrant=False)
    (out.sum() + Exp.apply(x).sum()).backward()
    torch.save({"out": out.detach(), "x": x.grad, "w": w.grad}, "result.pt")
    print(out.detach().tolist())
