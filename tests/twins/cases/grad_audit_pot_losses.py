"""POT's optimal-transport losses, correct (0.9.7.post1, the newest): exact transport
between point clouds by their positions, by its weights (dual potentials, centred) and
its cost matrix, entropic transport by the envelope theorem, and a Gromov-Wasserstein fit.
POT hands each precomputed gradient to torch through an injector Function, which
grad_audit judges through the library call that computed it, at its first calls: silent,
and the program runs exactly as unguarded."""

import ot
import torch

TWIN = {
    "libraries": ["pot-0.9.7"],
    "requires": ["grad_audit_on"],
    "policy": """
        [guards.grad_audit]
        max_forward_ms = 10000
    """,
}


def main():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(9, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randn(7, 2, generator=gen, dtype=torch.float64)
    a = torch.full((9,), 1 / 9, dtype=torch.float64, requires_grad=True)
    b = torch.full((7,), 1 / 7, dtype=torch.float64, requires_grad=True)
    ot.emd2(a, b, ot.dist(x, y)).backward()
    ot.solve(ot.dist(x, y), reg=0.5, grad="envelope").value.backward()
    points = torch.rand(5, 2, generator=gen, dtype=torch.float64)
    C1 = torch.cdist(points, points) + 0.1
    start = torch.rand(5, 5, generator=gen, dtype=torch.float64) * 0.5 + 0.3
    C2 = torch.nn.Parameter((start + start.T) / 2)
    optimizer = torch.optim.SGD([C2], lr=0.5)
    for _ in range(5):
        optimizer.zero_grad()
        ot.gromov_wasserstein2(C1, C2, loss_fun="square_loss").backward()
        optimizer.step()
    result = {"x": x.grad, "a": a.grad, "b": b.grad, "C2": C2.detach()}
    torch.save(result, "result.pt")
