"""A LightningModule with two optimizers (manual optimisation: ``opt_a.step()`` and
``opt_b.step()``, both reaching Adam and SGD through one line of Lightning's precision
plugin): the NaN steps are skipped inside each optimizer, as not calling that ``step()`` by
hand does, and each optimizer's event names its own line of the program, two call sites,
neither in Lightning.

Lightning 2.x supports several optimizers only with manual optimisation. The run is bounded
by the data (one epoch of 8 batches), not by ``max_steps``: in manual optimisation Lightning
counts every ``LightningOptimizer.step()`` call of either optimizer, and a step the guard
skips is still such a call while a step skipped by hand is not, so a bound on steps would
end the two runs at different batches. Nothing else reads that count here (no logger, no
checkpoint), so the weights, states and ``param_groups`` are the whole comparison.
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
            "events": ["grad_health/nonfinite_gradient"] * 2 + ["grad_health/steps_skipped"] * 2,
            "maybe": ["grad_health/nonfinite_origin"],
            "like": "handfix",
        },
        "observe": {
            "events": ["grad_health/nonfinite_gradient"] * 2
            + ["grad_health/nonfinite_loss", "grad_health/nonfinite_origin"] * 2,
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


def distance(module, x, exact_zero):
    out = module(x)
    # The target is the output itself when exact_zero: sqrt of an exact zero, a NaN gradient.
    target = out.detach() if exact_zero else torch.zeros_like(out)
    return (out - target).pow(2).sum(-1).sqrt().mean()


def stepping(module, optimizer):
    """False when the hand fix skips this optimizer's step (its gradients cleared)."""
    if os.environ.get("TWIN_HANDFIX") and not all_finite(module.parameters()):
        optimizer.zero_grad()
        return False
    return True


class TwoModels(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.a = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3))
        self.b = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 3))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        opt_a, opt_b = self.optimizers()
        opt_a.zero_grad()
        self.manual_backward(distance(self.a, x, batch_idx in NAN_STEPS))
        if stepping(self.a, opt_a):
            opt_a.step()
        opt_b.zero_grad()
        self.manual_backward(distance(self.b, x, batch_idx in NAN_STEPS))
        if stepping(self.b, opt_b):
            opt_b.step()

    def configure_optimizers(self):
        return (
            torch.optim.Adam(self.a.parameters(), lr=0.05),
            torch.optim.SGD(self.b.parameters(), lr=0.05, momentum=0.9),
        )


def train():
    """The fit; returns the trainer and the module it trained."""
    torch.manual_seed(0)
    model = TwoModels()
    data = DataLoader(TensorDataset(torch.rand(40, 3) + 0.5), batch_size=5)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
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
    print("weights finite:", finite)
    torch.save(
        {
            "model": model.state_dict(),
            "optimizers": [o.state_dict() for o in trainer.optimizers],
            "param_groups": [[dict(g) for g in o.param_groups] for o in trainer.optimizers],
        },
        "result.pt",
    )
