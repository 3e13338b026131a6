"""A parameter that never gets a gradient (its branch is detached): named once in every
mode; the training itself is exactly the same, but strict fails the run on the finding."""

import torch
from torch import nn

TWIN = {
    "modes": {
        "fix": {"events": ["grad_health/lost_gradient"]},
        "observe": {"events": ["grad_health/lost_gradient"]},
        "strict": {
            "events": ["grad_health/lost_gradient"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        features = self.backbone(x).detach()  # the mistake: the backbone never trains
        return self.head(features)


def main():
    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(120):  # past lost_steps (100 by default)
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
    torch.save(model.state_dict(), "result.pt")
