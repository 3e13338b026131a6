"""Issue 19 item 7: the user hooks ``meta["means2d"]`` (the gradient x10) and forgets
``retain_grad()``; the kept gradient must be the hooked one, as ``retain_grad()`` keeps
(hooks run first)."""

import os

import gsplat
import torch
from gsplat_on_cpu import loss_of, scene

TWIN = {
    "libraries": ["gsplat"],
    "modes": {"fix": {"events": ["gsplat_means2d/retain_grad"], "like": "handfix"}},
}


def main():
    data = scene()
    image, _, meta = gsplat.rasterization(**data, packed=False)
    means2d = meta["means2d"]
    means2d.register_hook(lambda grad: grad * 10)
    if os.environ.get("TWIN_HANDFIX"):
        means2d.retain_grad()
    loss = loss_of(image)
    loss.backward(retain_graph=True)
    first = means2d.grad.clone() if means2d.grad is not None else None
    loss.backward()  # accumulates, as retain_grad() does
    torch.save({"first": first, "twice": means2d.grad, "means": data["means"].grad}, "result.pt")
    print("kept:", first is not None)
