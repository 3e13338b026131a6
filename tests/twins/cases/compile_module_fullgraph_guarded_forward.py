"""``torch.compile(model, fullgraph=True)`` of a model whose ``forward`` is a guarded stage,
trained with grad on and evaluated under no_grad: the forward compiles as unguarded (the
guard runs beside the graph, never traced), and under no_grad the stage gets grad, as
calling it under ``torch.enable_grad()`` gives it."""

import os

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:Net.forward"
        action = "enable_grad"
    """,
    "modes": {
        "fix": {"events": ["grad_mode/enable_grad"], "like": "handfix"},
        "strict": {
            "events": ["grad_mode/enable_grad"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.lin(x).tanh()


def main():
    torch.manual_seed(0)
    net = Net()
    compiled = torch.compile(net, fullgraph=True, backend="eager")
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    for _ in range(3):
        opt.zero_grad()
        compiled(x).square().sum().backward()
        opt.step()
    with torch.no_grad():
        if os.environ.get("TWIN_HANDFIX"):
            with torch.enable_grad():
                out = compiled(x)
        else:
            out = compiled(x)
    print("requires grad:", out.requires_grad)
    print(out.detach().tolist(), [p.tolist() for p in net.parameters()])
