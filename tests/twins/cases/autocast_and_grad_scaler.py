"""Mixed precision on the CPU (``torch.autocast`` with bfloat16) around a guarded stage and
a training step: the same values, dtypes and weights, nothing logged."""

import torch
from torch import nn

TWIN = {
    "policy": """
        [[rules]]
        target = "case:project"
        action = "enable_grad"
    """,
}


def project(model, x):
    return model(x)


def main():
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = project(model, torch.randn(2, 8))
        print(out.dtype)
        out.float().pow(2).mean().backward()
        optimizer.step()
    torch.save(model.state_dict(), "result.pt")
