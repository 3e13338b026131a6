"""``optimizer.zero_grad()`` between ``loss.backward()`` and ``optimizer.step()``: torch's
default ``set_to_none=True`` leaves every ``.grad`` None at every step, and nothing trains.
Named once, at the step where ``lost_steps`` (100) is reached; the run itself is exactly the
same (nothing to skip or repair), but strict stops it there."""

import torch
from torch import nn

TWIN = {
    "modes": {
        "fix": {"events": ["grad_health/no_gradient"]},
        "observe": {"events": ["grad_health/no_gradient"]},
        "strict": {
            "events": ["grad_health/no_gradient"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(120):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        optimizer.zero_grad()  # the mistake: the gradients are gone before the step
        optimizer.step()
    torch.save(model.state_dict(), "result.pt")
