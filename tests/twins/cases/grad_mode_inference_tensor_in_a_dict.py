"""Issue 19 item 1: the inference tensor sits inside the caller's dict, so the stage gets a
copy of it holding a clone; what the stage adds to the dict, and writes into the tensor,
must still reach the caller's own dict and tensor."""

import os

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:normalise"
        action = "enable_grad"
    """,
    "modes": {
        "fix": {"events": ["grad_mode/enable_grad", "grad_mode/copy_back"], "like": "handfix"}
    },
}


def normalise(batch):
    points = batch["points"]
    scale = torch.ones(1, requires_grad=True)
    loss = (points * scale).pow(2).sum()
    loss.backward()
    batch["scale_grad"] = scale.grad.clone()
    batch["points"].div_(points.abs().max())  # in place, into the caller's tensor
    batch.pop("stale")
    return loss.detach()


def main():
    with torch.inference_mode():
        points = torch.arange(6.0).reshape(3, 2)
        batch = {"points": points, "stale": 1}
        if os.environ.get("TWIN_HANDFIX"):
            with torch.inference_mode(False), torch.enable_grad():
                clone = {"points": points.clone(), "stale": 1}
                loss = normalise(clone)
            with torch.inference_mode():
                points.copy_(clone["points"])
            batch.update(clone, points=points)
            batch.pop("stale")
        else:
            loss = normalise(batch)
    print(sorted(batch), batch["points"] is points, points.is_inference())
    torch.save({"points": points, "scale_grad": batch["scale_grad"], "loss": loss}, "result.pt")
