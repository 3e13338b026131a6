"""The Unique3D/Gradio pattern that works: grad disabled on the main thread, the stage run
by worker threads (grad is thread-local and on there): nothing to fix, nothing logged."""

from concurrent.futures import ThreadPoolExecutor

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:fit"
        action = "enable_grad"
    """,
    "modes": ["fix"],
}


def fit(target):
    weight = torch.zeros_like(target, requires_grad=True)
    ((weight - target) ** 2).sum().backward()
    return (weight - 0.5 * weight.grad).detach()


def main():
    torch.set_grad_enabled(False)
    targets = [torch.full((3,), float(i)) for i in range(6)]
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(fit, targets))
    print([r.tolist() for r in results], torch.is_grad_enabled())
    torch.save(results, "result.pt")
