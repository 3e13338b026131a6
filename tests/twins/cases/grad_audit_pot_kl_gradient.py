"""POT 0.9.3's ``gromov_wasserstein2`` with ``loss_fun="kl_loss"`` injects a gradient for
``C2`` with one term of the wrong sign (PythonOT/POT#610, fixed in 0.9.4): a fit of a
structure matrix by it walks away from the optimum. POT hands its precomputed gradient to
torch through an injector Function, which cannot be judged by itself: grad_audit re-calls
the library call that computed it on perturbed copies at its first call and names it
(``wrong_gradient``). It never changes a gradient, so fix and observe run exactly as
unguarded, and strict stops the run at the first backward."""

import ot
import torch

TWIN = {
    "libraries": ["pot-0.9.3"],
    "requires": ["grad_audit_on"],
    # POT's solver may take ~100 ms a call on a loaded machine: judged all the same
    "policy": """
        [guards.grad_audit]
        max_forward_ms = 10000
    """,
    "modes": {
        "fix": {"events": ["grad_audit/wrong_gradient"]},
        "observe": {"events": ["grad_audit/wrong_gradient"]},
        "strict": {
            "events": ["grad_audit/wrong_gradient"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


def main():
    gen = torch.Generator().manual_seed(7)
    points = torch.rand(5, 2, generator=gen, dtype=torch.float64)
    C1 = torch.cdist(points, points) + 0.1
    start = torch.rand(5, 5, generator=gen, dtype=torch.float64) * 0.5 + 0.3
    C2 = torch.nn.Parameter((start + start.T) / 2)
    p = ot.unif(5, type_as=C1)
    optimizer = torch.optim.SGD([C2], lr=0.5)
    losses = []
    for _ in range(10):
        optimizer.zero_grad()
        loss = ot.gromov_wasserstein2(C1, C2, p, p, loss_fun="kl_loss")
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            C2.copy_(((C2 + C2.T) / 2).clamp(1e-2, 2.0))
        losses.append(loss.item())
    torch.save({"C2": C2.detach(), "losses": torch.tensor(losses)}, "result.pt")
