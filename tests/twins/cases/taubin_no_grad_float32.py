"""PyTorch3D's taubin_smoothing on float32 vertices without grad: not risky, PyTorch3D's
own result, bit for bit."""

import pytorch3d_without_extension  # noqa: F401
import torch
from pytorch3d.ops import taubin_smoothing
from pytorch3d.utils import ico_sphere

TWIN = {"libraries": ["pytorch3d"], "modes": ["fix"]}


def main():
    torch.manual_seed(0)
    mesh = ico_sphere(2)
    noisy = mesh.offset_verts(0.05 * torch.randn_like(mesh.verts_packed()))
    smoothed = taubin_smoothing(noisy, num_iter=5)
    torch.save(smoothed.verts_packed(), "result.pt")
    print(smoothed.verts_packed().shape)
