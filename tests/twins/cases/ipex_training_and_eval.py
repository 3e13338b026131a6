"""IPEX stand-in on the CPU as an affected device: training with dropout (grad on) and
inference after ``model.eval()``, and a bicubic resize without a scale factor: nothing to
change, nothing logged."""

import intel_extension_for_pytorch  # noqa: F401
import torch
import torch.nn.functional as F
from torch import nn

TWIN = {
    "libraries": ["ipex-2.1.10+xpu"],
    "policy": """
        extends = "default"
        [guards.ipex_xpu]
        devices = ["cpu"]
    """,
    "modes": ["fix"],
}


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(4, 8))
        image = F.interpolate(torch.rand(1, 1, 4, 4), size=(8, 8), mode="bicubic")
    torch.save({"out": out, "image": image, "weights": model.state_dict()}, "result.pt")
