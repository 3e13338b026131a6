"""An Accelerate training loop (``Accelerator(cpu=True)``, a prepared model, optimizer and
data loader, ``accelerator.backward``): the NaN steps that reach ``AcceleratedOptimizer.step``
are skipped inside the wrapped Adam, as skipping the call by hand does, and the event names
the program's own ``optimizer.step()`` line, not the line in accelerate that calls Adam.

(The comparison itself checks that every event's call site is in the program's folder.)
"""

import os

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

TWIN = {
    "libraries": ["accelerate"],
    "modes": {
        "fix": {
            "events": ["grad_health/nonfinite_gradient", "grad_health/steps_skipped"],
            "maybe": ["grad_health/nonfinite_origin"],
            "like": "handfix",
        },
        "observe": {
            "events": [
                "grad_health/nonfinite_gradient",
                "grad_health/nonfinite_loss",
                "grad_health/nonfinite_origin",
            ],
            "maybe": ["grad_health/nonfinite_origin"],
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


def train():
    """The loop; returns the accelerator, model and optimizer it trained."""
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    data = DataLoader(TensorDataset(torch.rand(40, 3) + 0.5), batch_size=5)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    for step, (x,) in enumerate(data):
        optimizer.zero_grad()
        out = model(x)
        # At steps 3 and 4 the target is the output itself: the distance is an exact zero.
        target = out.detach() if step in NAN_STEPS else torch.zeros_like(out)
        loss = (out - target).pow(2).sum(-1).sqrt().mean()
        accelerator.backward(loss)
        if os.environ.get("TWIN_HANDFIX") and not all_finite(model.parameters()):
            optimizer.zero_grad()
            continue
        optimizer.step()
    return accelerator, model, optimizer


def main():
    accelerator, model, optimizer = train()
    model = accelerator.unwrap_model(model)
    finite = all(torch.isfinite(p).all().item() for p in model.parameters())
    print("weights finite:", finite)
    torch.save(
        {
            "model": model.state_dict(),
            "adam": optimizer.state_dict(),
            "param_groups": [dict(group) for group in optimizer.param_groups],
        },
        "result.pt",
    )
