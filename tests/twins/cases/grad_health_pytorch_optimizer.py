"""pytorch_optimizer's Lamb, Adan, Lookahead (around AdamW) and SAM (a closure optimizer,
around AdamW), each training its own model through the same NaN steps: every skipped step
leaves the weights, the state (Adan's previous gradient, Lookahead's slow weights, SAM's
perturbation), every ``param_groups`` key (``step``, Lookahead's ``counter``) and the inner
AdamW exactly as skipping the call by hand does.

SAM's gradients come from the pass before ``step(closure)``, which its first phase uses: the
guard checks those before the body runs. Each optimizer steps on its own line, one call site
(one event) each.
"""

import os

import torch
from pytorch_optimizer import SAM, Adan, Lamb, Lookahead
from torch import nn

TWIN = {
    "libraries": ["pytorch_optimizer"],
    "modes": {
        "fix": {
            "events": ["grad_health/nonfinite_gradient"] * 4 + ["grad_health/steps_skipped"] * 4,
            "maybe": ["grad_health/nonfinite_origin"],
            "like": "handfix",
        },
        "observe": {
            "events": ["grad_health/nonfinite_gradient"] * 4
            + ["grad_health/nonfinite_loss"] * 2
            + ["grad_health/nonfinite_origin"] * 2,
            # The wrapped AdamWs (Lookahead's, SAM's) step with the NaN too, as unguarded:
            # they may be named as call sites of their own.
            "maybe": ["grad_health/nonfinite_origin", *["grad_health/nonfinite_gradient"] * 2],
        },
        "strict": {
            "events": ["grad_health/nonfinite_gradient", "grad_health/nonfinite_origin"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}

NAN_STEPS = (3, 4)


def all_finite(parameters):
    return all(torch.isfinite(p.grad).all() for p in parameters if p.grad is not None)


def loss_of(model, x, exact_zero):
    out = model(x)
    # The target is the output itself when exact_zero: sqrt of an exact zero, a NaN gradient.
    target = out.detach() if exact_zero else torch.zeros_like(out)
    return (out - target).pow(2).sum(-1).sqrt().mean()


def ready(model, optimizer, x, exact_zero):
    """Backward for ``model``; False when the hand fix skips the step."""
    optimizer.zero_grad()
    loss_of(model, x, exact_zero).backward()
    if os.environ.get("TWIN_HANDFIX") and not all_finite(model.parameters()):
        optimizer.zero_grad()
        return False
    return True


def recompute(model, optimizer, x, exact_zero):
    """SAM's closure: the loss and gradients again, at the perturbed weights."""

    def closure():
        optimizer.zero_grad()
        loss = loss_of(model, x, exact_zero)
        loss.backward()
        return loss

    return closure


def mlp():
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3))


def main():
    torch.manual_seed(0)
    models = {name: mlp() for name in ("lamb", "adan", "lookahead", "sam")}
    lamb = Lamb(models["lamb"].parameters(), lr=1e-2)
    adan = Adan(models["adan"].parameters(), lr=1e-2)
    lookahead = Lookahead(torch.optim.AdamW(models["lookahead"].parameters(), lr=1e-2), k=3)
    sam = SAM(models["sam"].parameters(), torch.optim.AdamW, rho=0.05, lr=1e-2)
    for step in range(8):
        x = torch.rand(5, 3) + 0.5
        exact_zero = step in NAN_STEPS
        if ready(models["lamb"], lamb, x, exact_zero):
            lamb.step()
        if ready(models["adan"], adan, x, exact_zero):
            adan.step()
        if ready(models["lookahead"], lookahead, x, exact_zero):
            lookahead.step()
        if ready(models["sam"], sam, x, exact_zero):
            sam.step(recompute(models["sam"], sam, x, exact_zero))
    finite = {
        name: all(torch.isfinite(p).all().item() for p in model.parameters())
        for name, model in models.items()
    }
    print("weights finite:", finite)
    optimizers = {"lamb": lamb, "adan": adan, "lookahead": lookahead, "sam": sam}
    torch.save(
        {
            "models": {name: model.state_dict() for name, model in models.items()},
            "optimizers": {name: o.state_dict() for name, o in optimizers.items()},
            "param_groups": {
                name: [dict(group) for group in o.param_groups] for name, o in optimizers.items()
            },
            "inner": {
                "lookahead": lookahead.optimizer.state_dict(),
                "sam": sam.base_optimizer.state_dict(),
            },
        },
        "result.pt",
    )
