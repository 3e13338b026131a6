"""IPEX stand-in: ``F.interpolate(mode="bicubic", scale_factor=2)`` on an affected device is
computed on the CPU; here the device is the CPU, so the result is the same, bit for bit."""

import intel_extension_for_pytorch  # noqa: F401
import torch
import torch.nn.functional as F

TWIN = {
    "libraries": ["ipex-2.1.10+xpu"],
    "policy": """
        extends = "default"
        [guards.ipex_xpu]
        devices = ["cpu"]
    """,
    "modes": {
        "fix": {"events": ["ipex_xpu/bicubic_on_cpu"]},
        "observe": {"events": ["ipex_xpu/bicubic_on_cpu"]},
    },
}


def main():
    torch.manual_seed(0)
    image = torch.rand(1, 3, 5, 5)
    resized = F.interpolate(image, scale_factor=2, mode="bicubic", align_corners=False)
    torch.save(resized, "result.pt")
    print(resized.shape)
