"""SAM as it is copied from repository to repository (a two-phase closure optimizer wrapping
SGD): a NaN that appears only in the closure's evaluation aborts the whole step, the
perturbation undone and SGD never stepped; a NaN already in the gradients that the first
phase uses skips the step before its body. Both as skipping the step by hand does.

Step 3: the first pass is finite, the closure's pass (at the perturbed weights) is not: the
hand fix runs the two phases itself and, when the closure's gradients are not finite, puts
back the weights and SAM's state as they were before the step. Step 5: the first pass is
already not finite, so the hand fix does not call ``step`` at all.
"""

import os

import torch
from torch import nn

TWIN = {
    "modes": {
        "fix": {
            "events": ["grad_health/nonfinite_gradient", "grad_health/steps_skipped"],
            "maybe": ["grad_health/nonfinite_origin"],
            "like": "handfix",
        },
        "observe": {
            "events": ["grad_health/nonfinite_gradient"]
            + ["grad_health/nonfinite_loss", "grad_health/nonfinite_origin"] * 2,
            # The wrapped SGD steps with the NaN too, as unguarded: it may be named as a
            # call site of its own.
            "maybe": ["grad_health/nonfinite_origin", "grad_health/nonfinite_gradient"],
        },
        "strict": {
            "events": ["grad_health/nonfinite_gradient"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}

CLOSURE_NAN_STEP = 3  # only the closure's evaluation is not finite
FIRST_PASS_NAN_STEP = 5  # the gradients handed to step() are not finite already


class SAM(torch.optim.Optimizer):
    """Sharpness-Aware Minimization, as in the widely copied single-file implementation."""

    def __init__(self, params, base_optimizer, rho=0.05, adaptive=False, **kwargs):
        assert rho >= 0.0, f"Invalid rho, should be non-negative: {rho}"
        defaults = dict(rho=rho, adaptive=adaptive, **kwargs)
        super().__init__(params, defaults)
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups
        self.defaults.update(self.base_optimizer.defaults)

    @torch.no_grad()
    def first_step(self, zero_grad=False):
        grad_norm = self._grad_norm()
        for group in self.param_groups:
            scale = group["rho"] / (grad_norm + 1e-12)
            for p in group["params"]:
                if p.grad is None:
                    continue
                self.state[p]["old_p"] = p.data.clone()
                e_w = (torch.pow(p, 2) if group["adaptive"] else 1.0) * p.grad * scale.to(p)
                p.add_(e_w)  # climb to the local maximum "w + e(w)"
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad=False):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                p.data = self.state[p]["old_p"]  # get back to "w" from "w + e(w)"
        self.base_optimizer.step()  # do the actual "sharpness-aware" update
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is not None, "Sharpness Aware Minimization requires closure"
        closure = torch.enable_grad()(closure)  # the closure does a full forward-backward
        self.first_step(zero_grad=True)
        closure()
        self.second_step()

    def _grad_norm(self):
        shared_device = self.param_groups[0]["params"][0].device
        norm = torch.norm(
            torch.stack(
                [
                    ((torch.abs(p) if group["adaptive"] else 1.0) * p.grad)
                    .norm(p=2)
                    .to(shared_device)
                    for group in self.param_groups
                    for p in group["params"]
                    if p.grad is not None
                ]
            ),
            p=2,
        )
        return norm

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self.base_optimizer.param_groups = self.param_groups


def all_finite(parameters):
    return all(torch.isfinite(p.grad).all() for p in parameters if p.grad is not None)


def distance(model, x, exact_zero):
    out = model(x)
    # The target is the output itself when exact_zero: sqrt of an exact zero, a NaN gradient.
    target = out.detach() if exact_zero else torch.zeros_like(out)
    return (out - target).pow(2).sum(-1).sqrt().mean()


def recompute(model, x, exact_zero):
    """The closure: the loss and gradients again, at the perturbed weights."""

    def closure():
        loss = distance(model, x, exact_zero)
        loss.backward()
        return loss

    return closure


def step_by_hand(optimizer, params, closure):
    """SAM's step, its two phases run here so that a non-finite closure can be undone."""
    weights = [p.detach().clone() for p in params]
    state = {p: dict(optimizer.state[p]) for p in params if p in optimizer.state}
    state = {p: {k: v.clone() for k, v in kept.items()} for p, kept in state.items()}
    optimizer.first_step(zero_grad=True)
    closure()
    if all_finite(params):
        optimizer.second_step()
        return
    with torch.no_grad():
        for p, weight in zip(params, weights, strict=True):
            p.copy_(weight)
    for p in params:
        if p in state:
            optimizer.state[p].clear()
            optimizer.state[p].update(state[p])
        else:
            optimizer.state.pop(p, None)


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3))
    params = list(model.parameters())
    optimizer = SAM(params, torch.optim.SGD, lr=0.1, momentum=0.9)
    handfix = os.environ.get("TWIN_HANDFIX")
    for step in range(8):
        x = torch.rand(5, 3) + 0.5
        closure = recompute(model, x, step in (CLOSURE_NAN_STEP, FIRST_PASS_NAN_STEP))
        distance(model, x, step == FIRST_PASS_NAN_STEP).backward()
        if handfix and not all_finite(params):
            optimizer.zero_grad()
            continue
        if handfix:
            step_by_hand(optimizer, params, closure)
        else:
            optimizer.step(closure)
        optimizer.zero_grad()
    finite = all(torch.isfinite(p).all().item() for p in params)
    print("weights finite:", finite)
    torch.save(
        {
            "model": model.state_dict(),
            "sam": optimizer.state_dict(),
            "sgd": optimizer.base_optimizer.state_dict(),
            "param_groups": [dict(group) for group in optimizer.param_groups],
        },
        "result.pt",
    )
