"""gsplat rendering for a preview under ``torch.no_grad()``, and with grad but no backward:
not risky, nothing logged."""

import gsplat
import torch
from gsplat_on_cpu import scene

TWIN = {"libraries": ["gsplat"]}


def main():
    data = scene()
    with torch.no_grad():
        preview, alphas, _ = gsplat.rasterization(**data, packed=False)
    image, _, meta = gsplat.rasterization(**data, packed=True)
    torch.save({"preview": preview, "alphas": alphas, "image": image.detach()}, "result.pt")
    print(preview.shape, meta["means2d"].shape)
