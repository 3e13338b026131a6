"""taubin_smoothing on vertices that require grad: sent down the guard's dense O(E) path,
which equals calling ``autograd_guard.taubin.taubin_smoothing`` by hand."""

import os

import pytorch3d_without_extension  # noqa: F401
import torch
from pytorch3d.ops import taubin_smoothing
from pytorch3d.structures import Meshes
from pytorch3d.utils import ico_sphere

TWIN = {
    "libraries": ["pytorch3d"],
    "modes": {
        "fix": {"events": ["pytorch3d_taubin/redirect"], "like": "handfix"},
        "observe": {"events": ["pytorch3d_taubin/redirect"]},
        "strict": {
            "events": ["pytorch3d_taubin/redirect"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


def main():
    torch.manual_seed(0)
    sphere = ico_sphere(2)
    verts = sphere.verts_packed() + 0.05 * torch.randn(sphere.verts_packed().shape)
    verts.requires_grad_()
    mesh = Meshes([verts], [sphere.faces_packed()])
    if os.environ.get("TWIN_HANDFIX"):
        from autograd_guard.taubin import taubin_smoothing as dense

        smoothed = dense(mesh, num_iter=4)
    else:
        smoothed = taubin_smoothing(mesh, num_iter=4)
    smoothed.verts_packed().pow(2).sum().backward()
    torch.save({"verts": smoothed.verts_packed().detach(), "grad": verts.grad}, "result.pt")
