"""Warp 1.5.1 with ``action = "snapshot"``: the tensors are copied when tape.backward()
starts and restored after it, as passing a copy by hand keeps them."""

import os

import torch
import warp as wp

TWIN = {
    "libraries": ["warp-1.5.1"],
    "policy": """
        extends = "default"
        [guards.warp_torch_args]
        action = "snapshot"
    """,
    "modes": {
        "fix": {
            "events": ["warp_torch_args/snapshot", "warp_torch_args/snapshot_restored"],
            "like": "handfix",
        },
    },
}


@wp.kernel
def scale(x: wp.array(dtype=float), s: float, z: wp.array(dtype=float)):
    i = wp.tid()
    z[i] = x[i] * s


def main():
    wp.config.quiet = True
    wp.init()
    x, z = torch.arange(5.0), torch.zeros(5)
    wp_z = wp.from_torch(z, requires_grad=True)
    argument = x.clone() if os.environ.get("TWIN_HANDFIX") else x
    tape = wp.Tape()
    with tape:
        wp.launch(scale, dim=5, inputs=[argument, 3.0], outputs=[wp_z], device="cpu")
    tape.backward(grads={wp_z: wp.ones_like(wp_z)})
    print("x", x.tolist(), "z", z.tolist())
    torch.save({"x": x, "z": z}, "result.pt")
