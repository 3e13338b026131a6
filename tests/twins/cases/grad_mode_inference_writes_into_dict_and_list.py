"""Issue 19 item 1: a stage called in inference mode with an inference tensor writes into
the caller's ``batch`` dict and ``out`` list; those writes must reach the caller."""

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
        "strict": {
            "events": ["grad_mode/enable_grad"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


def fit(target, batch, out, names):
    weight = torch.zeros_like(target, requires_grad=True)
    loss = ((weight - target) ** 2).sum()
    loss.backward()
    batch["grad"] = weight.grad.clone()
    batch["steps"] = batch.get("steps", 0) + 1
    out.append(loss.detach())
    names.append("fit")
    return weight.grad


def main():
    batch, out, names = {"steps": 3}, [], []
    with torch.inference_mode():
        target = torch.arange(4.0)
        if os.environ.get("TWIN_HANDFIX"):
            with torch.inference_mode(False), torch.enable_grad():
                grad = fit(target.clone(), batch, out, names)
        else:
            grad = fit(target, batch, out, names)
    print("batch keys:", sorted(batch), "steps:", batch["steps"], "out:", len(out), names)
    torch.save({"batch": batch, "out": out, "grad": grad}, "result.pt")
