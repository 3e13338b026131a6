"""On the CPU, a dense mesh small on screen rendered with CUDA's coarse-to-fine settings:
binning is used only when asked for, and an overflowing bin raises ("too many faces")
instead of dropping faces, so the guard (whose remedy is for the CUDA kernel, which drops
them silently) stays out of the way in every mode: the same error, caught, the program's
fallback to naive rasterization, the same image and gradient, no event."""

import torch
from pytorch3d.renderer import (
    FoVPerspectiveCameras,
    MeshRasterizer,
    RasterizationSettings,
    look_at_view_transform,
)
from pytorch3d.structures import Meshes
from pytorch3d.utils import ico_sphere

TWIN = {"requires": ["pytorch3d._C"], "modes": ["fix", "observe", "strict"]}


def depth(mesh, settings):
    """The mean depth of the mesh's pixels."""
    R, T = look_at_view_transform(4.0, 10.0, 20.0)
    rasterizer = MeshRasterizer(cameras=FoVPerspectiveCameras(R=R, T=T), raster_settings=settings)
    fragments = rasterizer(mesh)
    return fragments.zbuf[fragments.pix_to_face >= 0].mean()


def main():
    sphere = ico_sphere(2)
    scale = torch.tensor([0.3], requires_grad=True)
    optimizer = torch.optim.SGD([scale], lr=0.01)
    binned = RasterizationSettings(image_size=32, bin_size=8, max_faces_per_bin=20)
    try:
        depth(Meshes([sphere.verts_packed() * scale], [sphere.faces_packed()]), binned)
    except RuntimeError as exc:
        print("binned on the CPU:", str(exc).splitlines()[0][:60])
    naive = RasterizationSettings(image_size=32, bin_size=0, faces_per_pixel=2)
    for step in range(3):
        optimizer.zero_grad()
        mesh = Meshes([sphere.verts_packed() * scale], [sphere.faces_packed()])
        loss = (depth(mesh, naive) - 3.5) ** 2
        loss.backward()
        optimizer.step()
        print(step, f"{loss.item():.6f}")
    torch.save({"scale": scale.detach(), "grad": scale.grad}, "result.pt")
