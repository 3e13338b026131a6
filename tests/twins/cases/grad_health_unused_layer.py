"""A correct loop over a model with a layer that is defined and never called in forward (an
optional head, as Lightning's own tests attach one): its parameters never get a gradient,
and that is no bug. Named once as a note (``unused_parameter``), never a finding: strict
runs to the end, bit for bit as unguarded."""

import torch
from torch import nn

TWIN = {
    "modes": {
        "fix": {"events": ["grad_health/unused_parameter"]},
        "observe": {"events": ["grad_health/unused_parameter"]},
        "strict": {"events": ["grad_health/unused_parameter"]},
    },
}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.extra = nn.Linear(8, 8)  # attached, never called

    def forward(self, x):
        return self.body(x)


def main():
    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(150):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
    torch.save(model.state_dict(), "result.pt")
