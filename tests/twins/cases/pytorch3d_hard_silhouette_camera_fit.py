"""A camera fitted to a reference silhouette, as in PyTorch3D's camera_position_optimization
tutorial, but rendered with ``blur_radius=0`` (pytorch3d#344): pixels outside the mesh
get no face, the silhouette's edges no gradient, and the fit barely moves. Nothing to
remedy (the settings are the user's): the guard names the render, the program runs as
unguarded, and strict stops after the first render."""

import torch
from pytorch3d.renderer import (
    BlendParams,
    FoVPerspectiveCameras,
    MeshRasterizer,
    MeshRenderer,
    RasterizationSettings,
    SoftSilhouetteShader,
)
from pytorch3d_scenes import IMAGE_SIZE, camera_at, ellipsoid, reference_view

TWIN = {
    "requires": ["pytorch3d._C"],
    "modes": {
        "fix": {"events": ["pytorch3d_hard_silhouette/no_silhouette_gradient"]},
        "observe": {"events": ["pytorch3d_hard_silhouette/no_silhouette_gradient"]},
        "strict": {
            "events": ["pytorch3d_hard_silhouette/no_silhouette_gradient"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


def main():
    mesh = ellipsoid()
    settings = RasterizationSettings(IMAGE_SIZE, blur_radius=0.0, faces_per_pixel=1)
    renderer = MeshRenderer(
        MeshRasterizer(cameras=FoVPerspectiveCameras(), raster_settings=settings),
        SoftSilhouetteShader(BlendParams(sigma=1e-4)),
    )
    R, T = reference_view()
    with torch.no_grad():  # the reference mask, rendered for its own sake
        target = renderer(mesh, R=R, T=T)[..., 3]
    position = torch.tensor([3.0, 6.9, 2.5], requires_grad=True)
    optimizer = torch.optim.Adam([position], lr=0.2)
    for step in range(4):
        optimizer.zero_grad()
        R, T = camera_at(position)
        loss = ((renderer(mesh, R=R, T=T)[..., 3] - target) ** 2).sum()
        loss.backward()
        optimizer.step()
        print(step, f"{loss.item():.6f}")
    torch.save({"position": position.detach(), "grad": position.grad}, "result.pt")
