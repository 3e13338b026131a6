"""Optimal-transport losses of POT (Python Optimal Transport), called as users call them,
for grad_audit's judgement of injected gradients (``tests/test_grad_audit_pot.py``) and
its false-alarm rate (``scripts/grad_audit_false_alarms.py --pot``). POT computes each
loss and its gradient itself and hands both to torch through an injector Function
(``set_gradients``). Each case runs from a seed and returns what it produced (lists).

``gw_kl_fit`` is POT#610: ``gromov_wasserstein2(..., loss_fun="kl_loss")`` injects a
gradient for ``C2`` with one term of the wrong sign on POT 0.8.0 to 0.9.3 (fixed in
0.9.4). The rest are correct on every release used here."""

from __future__ import annotations

import ot
import torch


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _points(gen: torch.Generator, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    n = int(torch.randint(4, 12, (1,), generator=gen))
    return torch.randn(n, 2, generator=gen, dtype=dtype)


def emd2_points(seed: int) -> list:
    """The exact transport cost between two point clouds, by the first one's positions."""
    gen = _gen(seed)
    x, y = _points(gen).requires_grad_(), _points(gen)
    loss = ot.emd2(ot.unif(len(x), type_as=x), ot.unif(len(y), type_as=y), ot.dist(x, y))
    loss.backward()
    return x.grad.tolist()


def emd2_marginals(seed: int) -> list:
    """The cost by its weights and its cost matrix (the weights' gradients are dual
    potentials: centred, the derivative along directions that keep the mass)."""
    gen = _gen(seed)
    n, m = (int(k) for k in torch.randint(3, 10, (2,), generator=gen))
    a = torch.rand(n, generator=gen, dtype=torch.float64) + 0.1
    b = torch.rand(m, generator=gen, dtype=torch.float64) + 0.1
    a, b = (a / a.sum()).requires_grad_(), (b / b.sum()).requires_grad_()
    M = torch.rand(n, m, generator=gen, dtype=torch.float64, requires_grad=True)
    ot.emd2(a, b, M).backward()
    return [a.grad.tolist(), b.grad.tolist(), M.grad.tolist()]


def emd2_float32(seed: int) -> list:
    gen = _gen(seed)
    x, y = _points(gen, torch.float32).requires_grad_(), _points(gen, torch.float32)
    loss = ot.emd2(ot.unif(len(x), type_as=x), ot.unif(len(y), type_as=y), ot.dist(x, y))
    loss.backward()
    return x.grad.tolist()


def _envelope(seed: int, iterations: int) -> list:
    gen = _gen(seed)
    x, y = _points(gen).requires_grad_(), _points(gen)
    result = ot.solve(ot.dist(x, y), reg=0.5, grad="envelope", max_iter=iterations)
    result.value.backward()
    return x.grad.tolist()


def sinkhorn_envelope(seed: int) -> list:
    """Entropic transport, gradient by the envelope theorem (``ot.solve``), converged."""
    return _envelope(seed, 1000)


def sinkhorn_envelope_early(seed: int) -> list:
    """The same stopped at 30 iterations, before its tolerance: its plan is not optimal,
    and its gradient is off a finite difference of its value by a few percent (90 % of
    directions within 2.3 %, measured on 30 seeds), by design."""
    return _envelope(seed, 30)


def _structure(gen: torch.Generator, n: int) -> torch.Tensor:
    points = torch.rand(n, 2, generator=gen, dtype=torch.float64)
    return torch.cdist(points, points) + 0.1


def _gw_fit(seed: int, loss_fun: str, steps: int) -> list:
    """A structure matrix ``C2`` fitted to ``C1`` by SGD on their Gromov-Wasserstein
    discrepancy, kept symmetric and in range (the shape of POT#610's report)."""
    gen = _gen(seed)
    n = int(torch.randint(4, 8, (1,), generator=gen))
    C1 = _structure(gen, n)
    start = torch.rand(n, n, generator=gen, dtype=torch.float64) * 0.5 + 0.3
    C2 = torch.nn.Parameter((start + start.T) / 2)
    p = ot.unif(n, type_as=C1)
    sgd = torch.optim.SGD([C2], lr=0.5)
    losses = []
    for _ in range(steps):
        sgd.zero_grad()
        loss = ot.gromov_wasserstein2(C1, C2, p, p, loss_fun=loss_fun)
        loss.backward()
        sgd.step()
        with torch.no_grad():
            C2.copy_(((C2 + C2.T) / 2).clamp(1e-2, 2.0))
        losses.append(loss.item())
    return [losses, C2.detach().tolist()]


def gw_square_fit(seed: int) -> list:
    return _gw_fit(seed, "square_loss", 5)


def gw_kl_fit(seed: int) -> list:
    return _gw_fit(seed, "kl_loss", 5)


def gw_kl_train(seed: int) -> list:
    """The KL fit run long enough to see where it goes."""
    return _gw_fit(seed, "kl_loss", 30)


def fused_gw(seed: int) -> list:
    """Fused Gromov-Wasserstein: features' costs and structures, by both."""
    gen = _gen(seed)
    n, m = (int(k) for k in torch.randint(4, 8, (2,), generator=gen))
    M = torch.rand(n, m, generator=gen, dtype=torch.float64, requires_grad=True)
    C1 = _structure(gen, n)
    C2 = _structure(gen, m).requires_grad_()
    ot.gromov.fused_gromov_wasserstein2(M, C1, C2, alpha=0.5).backward()
    return [M.grad.tolist(), C2.grad.tolist()]


def gw_float32_points(seed: int) -> list:
    """Gromov-Wasserstein between two float32 point clouds (most users train in float32),
    by the first one's positions: ``ot.dist(x, x)`` is symmetric only to float32
    rounding, and POT takes it for symmetric (it was judged along directions that are
    not, and named, in 1 of 45 seeds before the audit learnt that)."""
    gen = _gen(seed)
    n, m = (int(k) for k in torch.randint(3, 25, (2,), generator=gen))
    x = torch.randn(n, 2, generator=gen).requires_grad_()
    y = torch.randn(m, 3, generator=gen)
    ot.gromov.gromov_wasserstein2(ot.dist(x, x), ot.dist(y, y)).backward()
    return x.grad.tolist()


CLEAN = {
    case.__name__: case
    for case in (
        emd2_points,
        emd2_marginals,
        emd2_float32,
        sinkhorn_envelope,
        sinkhorn_envelope_early,
        gw_square_fit,
        gw_float32_points,
        fused_gw,
    )
}
SINCE_0_9_4 = ("sinkhorn_envelope", "sinkhorn_envelope_early")  # ot.solve(grad=...) is new
FIXED_ONLY = {"gw_kl_fit": gw_kl_fit}  # correct from POT 0.9.4 on
BUGS = {"gw_kl_fit": gw_kl_fit}  # wrong on POT 0.8.0 to 0.9.3
