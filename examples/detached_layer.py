"""A layer that never trains: its output is detached before the head.

AUTOGRAD_GUARD=1 python detached_layer.py   # names 0.weight and 0.bias
"""

import torch
from torch import nn

model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(120):
    optimizer.zero_grad()
    features = model[:2](torch.randn(8, 4)).detach()  # the mistake: layer 0 never trains
    model[2](features).pow(2).mean().backward()
    optimizer.step()
print("trained 120 steps")
