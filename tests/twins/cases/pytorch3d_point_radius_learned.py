"""A point cloud fit whose per-point radii are parameters too (pytorch3d#1562): the image
depends on the radius, but PyTorch3D's point rasterizer returns no gradient for it, so
``radius.grad`` stays None and the radii never train. Nothing to remedy: the guard names
the call (the program runs as unguarded) and strict stops before it."""

import torch
from pytorch3d.renderer import (
    FoVOrthographicCameras,
    PointsRasterizationSettings,
    PointsRasterizer,
)
from pytorch3d.structures import Pointclouds
from pytorch3d_scenes import IMAGE_SIZE, composite, point_cloud

TWIN = {
    "requires": ["pytorch3d._C"],
    "modes": {
        # grad_health names the radius at exit too: no gradient in any of the steps
        "fix": {
            "events": [
                "pytorch3d_point_radius/radius_not_differentiable",
                "grad_health/lost_gradient",
            ]
        },
        "observe": {
            "events": [
                "pytorch3d_point_radius/radius_not_differentiable",
                "grad_health/lost_gradient",
            ]
        },
        "strict": {
            "events": ["pytorch3d_point_radius/radius_not_differentiable"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


def render(points, radius):
    """PointsRasterizer with a per-point radius, as in pytorch3d#1562."""
    settings = PointsRasterizationSettings(IMAGE_SIZE, radius=radius, points_per_pixel=4)
    rasterizer = PointsRasterizer(cameras=FoVOrthographicCameras(), raster_settings=settings)
    fragments = rasterizer(Pointclouds([points]))
    weights = (1 - fragments.dists / 0.05**2).clamp(0, 1) * (fragments.idx >= 0)
    return composite(fragments, weights)


def main():
    points, radius, target = point_cloud()
    optimizer = torch.optim.Adam([points, radius], lr=0.01)
    for step in range(4):
        optimizer.zero_grad()
        loss = ((render(points, radius) - target) ** 2).mean()
        loss.backward()
        optimizer.step()
        print(step, f"{loss.item():.6f}", "radius.grad is None:", radius.grad is None)
    torch.save({"points": points.detach(), "radius": radius.detach()}, "result.pt")
