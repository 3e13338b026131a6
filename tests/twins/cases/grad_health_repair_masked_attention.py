"""Softmax over a query row that the padding mask masks fully: NaN in the forward pass,
left out of the loss, a NaN gradient on every step. fix skips two steps, then repairs at
the op (the masked row's gradient is 0) and ends where the documented fix (a large finite
fill instead of -inf) ends: the same loss and weights to two decimals."""

import os

import torch

TWIN = {
    "modes": {
        "fix": {
            "events": [
                "grad_health/nonfinite_gradient",
                "grad_health/nonfinite_repaired",
                "grad_health/nonfinite_origin",
                "grad_health/steps_repaired",
                "grad_health/steps_skipped",
            ],
            "like": "handfix",
        }
    }
}


def main():
    torch.manual_seed(0)
    batch, length, width = 4, 6, 8
    x, target = torch.randn(batch, length, width), torch.randn(batch, length, width)
    pad = torch.ones(batch, length, dtype=torch.bool)
    pad[0, 3:] = pad[2, 4:] = False
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    mask = pad[:, None, :] & causal & pad[:, :, None]  # a padded query masks every key
    q, k, v = (torch.nn.Linear(width, width) for _ in range(3))
    optimizer = torch.optim.SGD([*q.parameters(), *k.parameters(), *v.parameters()], lr=0.1)
    fill = -1e9 if os.environ.get("TWIN_HANDFIX") else float("-inf")
    for _ in range(150):
        scores = (q(x) @ k(x).transpose(1, 2) / width**0.5).masked_fill(~mask, fill)
        loss = (torch.softmax(scores, -1) @ v(x) - target).pow(2)[pad].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("loss:", round(loss.item(), 2))
    print("weights:", [round(w, 1) for w in v.weight.flatten().tolist()[:8]])
