"""Correct code: PyTorch3D's deform-a-sphere tutorial (points sampled from the mesh, chamfer
distance, edge, normal-consistency and Laplacian terms): the face areas are read without
grad and no face normal gets a gradient, so nothing is risky; PyTorch3D's own result, bit
for bit, and no event."""

import torch
from pytorch3d.loss import (
    chamfer_distance,
    mesh_edge_loss,
    mesh_laplacian_smoothing,
    mesh_normal_consistency,
)
from pytorch3d.ops import sample_points_from_meshes
from pytorch3d.utils import ico_sphere

TWIN = {"requires": ["pytorch3d._C"], "modes": ["fix", "strict"]}


def main():
    torch.manual_seed(0)
    sphere = ico_sphere(2)
    target = sphere.scale_verts(0.7).offset_verts(0.1 * torch.randn(sphere.verts_packed().shape))
    target_points = sample_points_from_meshes(target, 500)
    offsets = torch.zeros_like(sphere.verts_packed(), requires_grad=True)
    optimizer = torch.optim.SGD([offsets], lr=1.0, momentum=0.9)
    for step in range(4):
        optimizer.zero_grad()
        mesh = sphere.offset_verts(offsets)
        points = sample_points_from_meshes(mesh, 500)
        loss = (
            chamfer_distance(points, target_points)[0]
            + mesh_edge_loss(mesh)
            + 0.01 * mesh_normal_consistency(mesh)
            + 0.1 * mesh_laplacian_smoothing(mesh, method="uniform")
        )
        loss.backward()
        optimizer.step()
        print(step, f"{loss.item():.6f}")
    torch.save({"offsets": offsets.detach(), "grad": offsets.grad}, "result.pt")
