"""taubin_smoothing on float64 vertices fails in PyTorch3D ("expected scalar type Float");
the guard sends it down the dense path, as calling it by hand does."""

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
    },
}


def main():
    sphere = ico_sphere(1)
    mesh = Meshes([sphere.verts_packed().double()], [sphere.faces_packed()])
    if os.environ.get("TWIN_HANDFIX"):
        from autograd_guard.taubin import taubin_smoothing as dense

        smoothed = dense(mesh, num_iter=3)
    else:
        smoothed = taubin_smoothing(mesh, num_iter=3)
    print(smoothed.verts_packed().dtype)
    torch.save(smoothed.verts_packed(), "result.pt")
