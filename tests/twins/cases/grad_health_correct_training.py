"""A plain training loop with torch's own optimizers (Adam, SGD with momentum, AdamW on
param groups): the step check changes nothing, bit for bit, and logs nothing."""

import torch
from torch import nn

TWIN = {"modes": ["fix", "observe", "strict"]}


def train(optimizer_class, **options):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    groups = [
        {"params": model[0].parameters()},
        {"params": model[2].parameters(), "lr": 0.01},
    ]
    optimizer = optimizer_class(groups, lr=0.05, **options)
    data, target = torch.randn(32, 4), torch.randn(32, 1)
    for _ in range(10):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(data), target)
        loss.backward()
        optimizer.step()
    return model.state_dict(), optimizer.state_dict()["state"], loss.detach()


def main():
    results = {
        "adam": train(torch.optim.Adam),
        "sgd": train(torch.optim.SGD, momentum=0.9, nesterov=True),
        "adamw": train(torch.optim.AdamW, weight_decay=0.1),
    }
    torch.save(results, "result.pt")
    print({k: v[2].item() for k, v in results.items()})
