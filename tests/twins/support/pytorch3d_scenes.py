"""Small scenes for the twin cases that run PyTorch3D's compiled rasterizers: a point
cloud fitted to a square, with per-point radii, and an ellipsoid seen by a camera placed
as in PyTorch3D's camera_position_optimization tutorial. The calls a guard watches stay
in the cases themselves (their call sites must be the program's own code)."""

import torch
from pytorch3d.renderer import AlphaCompositor, look_at_rotation, look_at_view_transform
from pytorch3d.structures import Meshes
from pytorch3d.utils import ico_sphere

IMAGE_SIZE = 32


def point_cloud(count=60):
    """Points in front of the camera, their radii (both parameters) and a target image."""
    torch.manual_seed(0)
    points = torch.rand(count, 3) * 1.4 - 0.7
    points[:, 2] = points[:, 2].abs() + 1.0
    radius = torch.full((1, count), 0.05, requires_grad=True)
    target = torch.zeros(1, IMAGE_SIZE, IMAGE_SIZE, 3)
    target[:, 8:24, 8:24] = 1.0
    return points.requires_grad_(), radius, target


def composite(fragments, weights):
    """White points alpha-composited over black, from the rasterizer's fragments and a
    weight per fragment (PointsRenderer takes one radius for all points)."""
    idx = fragments.idx.long()
    compositor = AlphaCompositor(background_color=(0.0, 0.0, 0.0))
    features = torch.ones(3, int(idx.max()) + 1)
    image = compositor(idx.permute(0, 3, 1, 2), weights.permute(0, 3, 1, 2), features)
    return image.permute(0, 2, 3, 1)


def ellipsoid():
    sphere = ico_sphere(1)
    return Meshes([sphere.verts_packed() * torch.tensor([1.0, 0.5, 0.3])], [sphere.faces_packed()])


def reference_view():
    return look_at_view_transform(3.0, 30.0, 40.0)


def camera_at(position):
    """The rotation and translation of a camera at ``position`` looking at the origin."""
    R = look_at_rotation(position[None])
    T = -torch.bmm(R.transpose(1, 2), position[None, :, None])[:, :, 0]
    return R, T
