"""Functions under snapshot rules (version and data checks, tensors by position and by
keyword, views, integer and bool tensors, NaNs) that write nothing: nothing changes."""

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:blend"
        action = "snapshot"
        [[rules]]
        target = "case:masked_mean"
        action = "snapshot"
        check = "data"
    """,
    "modes": ["fix"],
}


def blend(a, b, weight=0.5):
    return a * weight + b * (1 - weight)


def masked_mean(values, mask, *, counts=None):
    picked = values[mask]
    total = picked.nansum()
    return total / (counts if counts is not None else mask.sum())


def main():
    torch.manual_seed(0)
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    values = torch.tensor([1.0, float("nan"), 3.0, -0.0])
    mask = torch.tensor([True, True, False, True])
    out = {
        "blend": blend(a, b),
        "blend_kw": blend(a=a[1:], b=b[1:].t().t(), weight=0.25),
        "mean": masked_mean(values, mask),
        "mean_kw": masked_mean(values=values, mask=mask, counts=torch.tensor(2)),
        "ints": blend(torch.arange(3), torch.arange(3), weight=2),
        "values": values,
    }
    torch.save(out, "result.pt")
    print({k: v.tolist() for k, v in out.items()})
