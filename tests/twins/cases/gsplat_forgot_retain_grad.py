"""gsplat: ``meta["means2d"].grad`` is None after backward unless ``retain_grad()`` was called
on it (gsplat#467); the guard keeps it as ``retain_grad()`` would."""

import os

import gsplat
import torch
from gsplat_on_cpu import loss_of, scene

TWIN = {
    "libraries": ["gsplat"],
    "modes": {
        "fix": {"events": ["gsplat_means2d/retain_grad"], "like": "handfix"},
        "observe": {"events": ["gsplat_means2d/retain_grad"]},
    },
}


def main():
    data = scene()
    image, _, meta = gsplat.rasterization(**data, packed=False)
    if os.environ.get("TWIN_HANDFIX"):
        meta["means2d"].retain_grad()
    loss_of(image).backward()
    grad = meta["means2d"].grad
    print("means2d grad is None:", grad is None)
    torch.save({"means2d_grad": grad, "means_grad": data["means"].grad}, "result.pt")
