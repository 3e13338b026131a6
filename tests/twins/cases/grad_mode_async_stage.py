"""A coroutine stage awaited from an event loop whose thread has grad disabled."""

import asyncio
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


async def fit(target):
    weight = torch.zeros_like(target, requires_grad=True)
    for _ in range(3):
        await asyncio.sleep(0)
        loss = ((weight - target) ** 2).sum()
        loss.backward()
        with torch.no_grad():
            weight -= 0.25 * weight.grad
            weight.grad = None
    return weight.detach()


async def app():
    target = torch.tensor([2.0, 4.0])
    if os.environ.get("TWIN_HANDFIX"):
        with torch.enable_grad():
            return await fit(target)
    return await fit(target)


def main():
    torch.set_grad_enabled(False)
    weight = asyncio.run(app())
    print(weight.tolist(), torch.is_grad_enabled())
