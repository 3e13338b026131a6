"""IPEX < 2.1.30 (a stand-in distribution, the affected devices set to the CPU): a model
never put in eval mode runs inference with dropout active; the guard makes inference-time
dropout the identity, as ``model.eval()`` does."""

import os

import intel_extension_for_pytorch  # noqa: F401
import torch
from torch import nn

TWIN = {
    "libraries": ["ipex-2.1.10+xpu"],
    "policy": """
        extends = "default"
        [guards.ipex_xpu]
        devices = ["cpu"]
    """,
    "modes": {
        "fix": {"events": ["ipex_xpu/dropout_identity"], "like": "handfix"},
        "observe": {"events": ["ipex_xpu/dropout_identity"]},
    },
}


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2))
    if os.environ.get("TWIN_HANDFIX"):
        model.eval()
    torch.manual_seed(1)
    with torch.no_grad():
        out = model(torch.randn(4, 8))
    torch.save(out, "result.pt")
    print(out.shape)
