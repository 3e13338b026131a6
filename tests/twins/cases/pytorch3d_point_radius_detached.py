"""Correct code: learned per-point radii as the guard's remedy says, detached where they
reach the rasterizer and acting after it, in the compositor's weights (1 - d / r[idx]^2):
the radii train, nothing is risky; PyTorch3D's own result, bit for bit, and no event."""

import torch
from pytorch3d.renderer import (
    FoVOrthographicCameras,
    PointsRasterizationSettings,
    PointsRasterizer,
)
from pytorch3d.structures import Pointclouds
from pytorch3d_scenes import IMAGE_SIZE, composite, point_cloud

TWIN = {"requires": ["pytorch3d._C"], "modes": ["fix", "strict"]}


def render(points, radius):
    settings = PointsRasterizationSettings(IMAGE_SIZE, radius=radius.detach(), points_per_pixel=4)
    rasterizer = PointsRasterizer(cameras=FoVOrthographicCameras(), raster_settings=settings)
    fragments = rasterizer(Pointclouds([points]))
    own_radius = radius[0][fragments.idx.long().clamp(min=0)]
    weights = (1 - fragments.dists / own_radius**2).clamp(0, 1) * (fragments.idx >= 0)
    return composite(fragments, weights)


def main():
    points, radius, target = point_cloud()
    optimizer = torch.optim.Adam([points, radius], lr=0.01)
    step = 0
    while step < 4:
        optimizer.zero_grad()
        error = render(points, radius) - target
        error.pow(2).mean().backward()
        optimizer.step()
        step += 1
    print("radius trains:", radius.grad is not None and bool(radius.grad.abs().sum() > 0))
    torch.save({"points": points.detach(), "radius": radius.detach()}, "result.pt")
