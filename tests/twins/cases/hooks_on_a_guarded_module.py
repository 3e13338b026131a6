"""Forward pre-hooks, forward hooks, full backward hooks and tensor hooks on a module whose
``forward`` is a guarded stage: each runs once, in the same order, with the same values."""

import torch
from torch import nn

TWIN = {
    "policy": """
        [[rules]]
        target = "case:Block.forward"
        action = "enable_grad"
    """,
    "modes": ["fix"],
}

ORDER = []


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x):
        ORDER.append("forward")
        return torch.tanh(self.linear(x))


def main():
    torch.manual_seed(0)
    block = Block()
    block.register_forward_pre_hook(lambda m, args: ORDER.append("pre") or (args[0] * 2,))
    block.register_forward_hook(lambda m, args, out: ORDER.append("post") or out + 1)
    block.register_full_backward_hook(lambda m, gin, gout: ORDER.append("backward") or None)
    x = torch.randn(2, 3, requires_grad=True)
    out = block(x)
    out.register_hook(lambda grad: ORDER.append("tensor") or grad * 3)
    out.sum().backward()
    print(ORDER)
    torch.save(
        {"out": out.detach(), "x_grad": x.grad, "w_grad": block.linear.weight.grad}, "result.pt"
    )
