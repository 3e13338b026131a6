"""A user's step pre-hook that cleans NaN/Inf gradients (``nan_to_num_``) before Adam steps:
the guard checks the gradients the step would use, after that hook, so it sees clean ones
and changes nothing, in every mode: no event, no skipped step, no stop in strict."""

import torch
from torch import nn

TWIN = {"modes": ["fix", "observe", "strict"]}


def clean_gradients(optimizer, args, kwargs):
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                p.grad.nan_to_num_(0.0, posinf=0.0, neginf=0.0)


def main():
    torch.manual_seed(0)
    model = nn.Linear(3, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    optimizer.register_step_pre_hook(clean_gradients)
    nonfinite_steps = []
    for step in range(8):
        optimizer.zero_grad()
        out = model(torch.rand(5, 3) + 0.5)
        # At steps 3 and 4 the target is the output itself: the distance is an exact zero.
        target = out.detach() if step in (3, 4) else torch.zeros_like(out)
        loss = (out - target).pow(2).sum(-1).sqrt().mean()
        loss.backward()
        if not all(torch.isfinite(p.grad).all() for p in model.parameters()):
            nonfinite_steps.append(step)
        optimizer.step()
    print("non-finite before the hook at steps", nonfinite_steps)
    torch.save(
        {
            "model": model.state_dict(),
            "adam": optimizer.state_dict(),
            "param_groups": [dict(group) for group in optimizer.param_groups],
        },
        "result.pt",
    )
