"""A user's ``torch.autograd.Function`` whose backward is half the derivative, run where
grad_audit stands down (torch 2.1: its Dynamo breaks the graph at a hooked Function): no
event in any mode and the run exactly as unguarded, strict included. Where grad_audit
attaches, ``grad_audit_wrong_sign_function`` shows it at work."""

import torch

TWIN = {
    "requires": ["no_grad_audit_on"],
    "modes": {"fix": {}, "observe": {}, "strict": {}},
}


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return x * grad  # half of 2 x


def main():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4))
    adam = torch.optim.Adam([w], lr=0.01)
    for target in torch.randn(3, 4):
        adam.zero_grad()
        Square.apply(w).sub(target).abs().sum().backward()
        adam.step()
    torch.save({"w": w.detach()}, "result.pt")
