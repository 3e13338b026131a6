"""Correct code: face areas with grad (an area regulariser) beside face normals used
without grad: the normals get no gradient, so the guard, which keeps the library's areas
and their backward and computes only the normals in plain torch, says nothing, and the
vertices get the library's gradient bit for bit."""

import torch
from pytorch3d.structures import Meshes
from pytorch3d.utils import ico_sphere

TWIN = {"requires": ["pytorch3d._C"], "modes": ["fix", "observe", "strict"]}


def main():
    torch.manual_seed(0)
    sphere = ico_sphere(2)
    verts = (
        sphere.verts_packed() + 0.05 * torch.randn(sphere.verts_packed().shape)
    ).requires_grad_()
    optimizer = torch.optim.Adam([verts], lr=0.01)
    for step in range(4):
        optimizer.zero_grad()
        mesh = Meshes([verts], [sphere.faces_packed()])
        areas = mesh.faces_areas_packed()
        facing_up = (mesh.faces_normals_packed().detach()[:, 2] > 0).float()
        loss = (areas * (1 + facing_up)).var() + (mesh.verts_packed() ** 2).sum(1).sub(1).pow(
            2
        ).mean()
        loss.backward()
        optimizer.step()
        print(step, f"{loss.item():.8f}")
    torch.save({"verts": verts.detach(), "grad": verts.grad}, "result.pt")
