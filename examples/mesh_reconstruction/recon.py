"""A stand-in for Unique3D's ``mesh_reconstruction/recon.py``: stage 1 fits vertices by
gradient descent, so it needs grad (AiuniAI/Unique3D#19)."""

import torch


def reconstruct_stage1(target_verts: torch.Tensor, steps: int = 200) -> torch.Tensor:
    verts = torch.zeros_like(target_verts, requires_grad=True)
    optimizer = torch.optim.Adam([verts], lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = ((verts - target_verts) ** 2).mean()
        loss.backward()  # fails here when the caller disabled grad
        optimizer.step()
    return verts.detach()
