"""A sphere deformed so that its face normals match an ellipsoid's, through
``Meshes.faces_normals_packed()``: PyTorch3D's compiled backward gets the vertices'
gradient through the normals wrong (one z term uses ``cx`` for ``cy``); the guard's plain
torch areas and normals equal computing them by hand (same forward, right gradient)."""

import os

import torch
from pytorch3d.structures import Meshes
from pytorch3d.utils import ico_sphere

TWIN = {
    "requires": ["pytorch3d._C"],
    "modes": {
        "fix": {"events": ["pytorch3d_face_normals/redirect"], "like": "handfix"},
        "observe": {"events": ["pytorch3d_face_normals/redirect"]},
        "strict": {
            "events": ["pytorch3d_face_normals/redirect"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


def face_normals(mesh):
    if os.environ.get("TWIN_HANDFIX"):
        from autograd_guard.guards.pytorch3d_face_normals import face_areas_normals

        return face_areas_normals(mesh.verts_packed(), mesh.faces_packed())[1]
    return mesh.faces_normals_packed()


def main():
    torch.manual_seed(0)
    sphere = ico_sphere(2)
    target = Meshes(
        [sphere.verts_packed() * torch.tensor([1.0, 0.6, 0.4])], [sphere.faces_packed()]
    )
    target_normals = target.faces_normals_packed()
    offsets = torch.zeros_like(sphere.verts_packed(), requires_grad=True)
    optimizer = torch.optim.SGD([offsets], lr=0.5, momentum=0.9)
    for step in range(5):
        optimizer.zero_grad()
        mesh = sphere.offset_verts(offsets)
        loss = (1 - (face_normals(mesh) * target_normals).sum(1)).mean()
        loss.backward()
        optimizer.step()
        print(step, f"{loss.item():.6f}")
    torch.save({"offsets": offsets.detach(), "grad": offsets.grad}, "result.pt")
