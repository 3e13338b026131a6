"""A guarded stage called the normal way, with grad on: nothing changes, nothing is logged."""

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:fit"
        action = "enable_grad"
    """,
    "modes": ["fix", "observe", "strict"],
}


def fit(target, steps=20):
    verts = torch.zeros_like(target, requires_grad=True)
    optimizer = torch.optim.Adam([verts], lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = ((verts - target) ** 2).mean()
        loss.backward()
        optimizer.step()
    return verts.detach(), loss.detach()


def main():
    torch.manual_seed(0)
    target = torch.randn(16)
    verts, loss = fit(target)
    print("loss", loss.item())
    torch.save({"verts": verts, "loss": loss, "state": fit.__name__}, "result.pt")
