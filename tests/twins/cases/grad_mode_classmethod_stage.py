"""Issue 19 item 13: a ``classmethod`` stage (an alternative constructor that fits)."""

import os

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:Mesh.fitted_to"
        action = "enable_grad"
    """,
    "modes": {"fix": {"events": ["grad_mode/enable_grad"], "like": "handfix"}},
}


class Mesh:
    def __init__(self, verts):
        self.verts = verts

    @classmethod
    def fitted_to(cls, target):
        verts = torch.zeros_like(target, requires_grad=True)
        ((verts - target) ** 2).sum().backward()
        return cls((verts - 0.5 * verts.grad).detach())


class Sphere(Mesh):
    pass


def main():
    torch.set_grad_enabled(False)
    target = torch.tensor([1.0, 2.0])
    if os.environ.get("TWIN_HANDFIX"):
        with torch.enable_grad():
            mesh = Sphere.fitted_to(target)
    else:
        mesh = Sphere.fitted_to(target)
    print(type(mesh).__name__, mesh.verts.tolist())
