"""A fitting stage that calls backward() is entered with grad disabled (Unique3D#19)."""

import os

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:fit"
        action = "enable_grad"
    """,
    "modes": {
        "fix": {"events": ["grad_mode/enable_grad"], "like": "handfix"},
        "observe": {
            "events": ["grad_mode/enable_grad"],
            "maybe": ["grad_mode/failure_note"],  # Python 3.10: the note as an event
            "stderr": "autograd-guard: the stage case:fit was entered with grad disabled",
        },
        "strict": {
            "events": ["grad_mode/enable_grad"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


def fit(target, steps=20):
    verts = torch.zeros_like(target, requires_grad=True)
    optimizer = torch.optim.SGD([verts], lr=0.2)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = ((verts - target) ** 2).mean()
        loss.backward()
        optimizer.step()
    return verts.detach(), loss.detach()


def main():
    torch.set_grad_enabled(False)  # as an app's __main__ does
    target = torch.linspace(-1, 1, 8)
    if os.environ.get("TWIN_HANDFIX"):
        with torch.enable_grad():
            verts, loss = fit(target)
    else:
        verts, loss = fit(target)
    print("grad enabled after the stage:", torch.is_grad_enabled())
    torch.save({"verts": verts, "loss": loss}, "result.pt")
