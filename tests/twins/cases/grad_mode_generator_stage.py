"""A generator stage (it yields per-step losses) driven with grad disabled."""

import os

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:fit_steps"
        action = "enable_grad"
    """,
    "modes": {
        "fix": {"events": ["grad_mode/enable_grad"], "like": "handfix"},
        "observe": {"events": ["grad_mode/enable_grad"]},
    },
}


def fit_steps(target, steps):
    weight = torch.zeros_like(target, requires_grad=True)
    for _ in range(steps):
        loss = ((weight - target) ** 2).sum()
        loss.backward()
        with torch.no_grad():
            weight -= 0.1 * weight.grad
            weight.grad = None
        yield loss.item()


def main():
    torch.set_grad_enabled(False)
    target = torch.tensor([1.0, -2.0, 3.0])
    losses = []
    generator = fit_steps(target, 5)
    while True:
        try:
            if os.environ.get("TWIN_HANDFIX"):
                with torch.enable_grad():
                    loss = next(generator)
            else:
                loss = next(generator)
        except StopIteration:
            break
        losses.append(loss)
        print("between steps, grad enabled:", torch.is_grad_enabled())
    print(losses)
