"""A NaN gradient from a finite forward: sqrt of an exact zero (steps 3 and 4).

python nan_gradient.py                    # weights finite: False
AUTOGRAD_GUARD=1 python nan_gradient.py   # the steps are skipped and the op is named
"""

import torch

torch.manual_seed(0)
model = torch.nn.Linear(3, 3)
optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
for step in range(6):
    optimizer.zero_grad()
    out = model(torch.rand(5, 3))
    target = out.detach() if step in (3, 4) else torch.zeros_like(out)
    loss = (out - target).pow(2).sum(-1).sqrt().mean()  # sqrt(0): a NaN gradient
    loss.backward()
    optimizer.step()
print("weights finite:", all(p.isfinite().all().item() for p in model.parameters()))
