"""A LightningModule with automatic optimisation (``Trainer(max_steps=8)``): Lightning runs
``training_step`` and the backward inside Adam's ``step(closure)``; the NaN steps are
skipped there, and the event names the program's own line, not Lightning's.

The hand fix, as a Lightning user writes it: ``on_before_optimizer_step`` cannot skip a
step, so ``optimizer_step`` is overridden to run the closure itself (``training_step``,
``zero_grad``, backward, as ``step`` would run them first), return without stepping when the
gradients are not finite, and otherwise step with a closure that returns that loss.
Lightning counts the step either way (``max_steps`` reads its count of ``optimizer_step``
calls, not of real steps), so both runs end after the same 8 batches. What the skipped steps
leave out differs only in Lightning's ``on_before_optimizer_step`` hooks and gradient
clipping, which run inside the closure in the guarded run: there are none here.
"""

import os

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

TWIN = {
    "libraries": ["lightning"],
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
            "events": ["grad_health/nonfinite_gradient"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}

NAN_STEPS = (3, 4)


def all_finite(parameters):
    return all(torch.isfinite(p.grad).all() for p in parameters if p.grad is not None)


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        out = self.net(x)
        # At steps 3 and 4 the target is the output itself: the distance is an exact zero.
        target = out.detach() if batch_idx in NAN_STEPS else torch.zeros_like(out)
        return (out - target).pow(2).sum(-1).sqrt().mean()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


class HandFixed(Regression):
    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        loss = optimizer_closure()
        if not all_finite(self.parameters()):
            return  # skipped; the next closure's zero_grad clears the gradients
        optimizer.step(closure=lambda: loss)


def train():
    """The fit; returns the trainer and the module it trained."""
    torch.manual_seed(0)
    model = HandFixed() if os.environ.get("TWIN_HANDFIX") else Regression()
    data = DataLoader(TensorDataset(torch.rand(40, 3) + 0.5), batch_size=5)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=8,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data)
    return trainer, model


def main():
    trainer, model = train()
    finite = all(torch.isfinite(p).all().item() for p in model.parameters())
    print("weights finite:", finite, "steps:", trainer.global_step)
    torch.save(
        {
            "model": model.state_dict(),
            "adam": trainer.optimizers[0].state_dict(),
            "param_groups": [dict(g) for g in trainer.optimizers[0].param_groups],
        },
        "result.pt",
    )
