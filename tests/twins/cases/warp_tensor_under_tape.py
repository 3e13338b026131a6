"""Warp 1.5.1: a torch tensor passed to ``wp.launch`` under a Tape gets the gradient added
into its values by ``tape.backward()`` (NVIDIA/warp#394); the guard passes
``wp.from_torch(t, dtype=...)`` as the hand fix does."""

import os

import torch
import warp as wp

TWIN = {
    "libraries": ["warp-1.5.1"],
    "modes": {
        "fix": {"events": ["warp_torch_args/convert"], "like": "handfix"},
        "observe": {"events": ["warp_torch_args/convert"]},
        "strict": {
            "events": ["warp_torch_args/convert"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


@wp.kernel
def add(x: wp.array(dtype=wp.vec3), y: wp.array(dtype=wp.vec3), z: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    z[i] = x[i] + y[i]


def main():
    wp.config.quiet = True
    wp.init()
    x, y, z = torch.ones(8, 3), torch.ones(8, 3), torch.zeros(8, 3)
    wp_y = wp.from_torch(y, dtype=wp.vec3, requires_grad=True)
    wp_z = wp.from_torch(z, dtype=wp.vec3, requires_grad=True)
    argument = wp.from_torch(x, dtype=wp.vec3) if os.environ.get("TWIN_HANDFIX") else x
    tape = wp.Tape()
    with tape:
        wp.launch(add, dim=8, inputs=[argument, wp_y], outputs=[wp_z], device="cpu")
    tape.backward(grads={wp_z: wp.ones_like(wp_z)})
    print("x", x[0].tolist(), "z", z[0].tolist(), "y grad", wp_y.grad.numpy()[0].tolist())
    torch.save({"x": x, "z": z}, "result.pt")
