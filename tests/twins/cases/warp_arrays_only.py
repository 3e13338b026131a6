"""Correct Warp code: Warp arrays under the tape, a torch tensor only without a tape, on the
affected 1.5.1: nothing changes, nothing is logged."""

import torch
import warp as wp

TWIN = {
    "libraries": ["warp-1.5.1"],
    "policy": """
        extends = "default"
        [guards.warp_torch_args]
        bridge_grads = true
    """,
}


@wp.kernel
def add(x: wp.array(dtype=wp.vec3), y: wp.array(dtype=wp.vec3), z: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    z[i] = x[i] + y[i]


def main():
    wp.config.quiet = True
    wp.init()
    x, y, z = torch.ones(6, 3), torch.full((6, 3), 2.0), torch.zeros(6, 3)
    arrays = [wp.from_torch(t, dtype=wp.vec3, requires_grad=True) for t in (x, y, z)]
    tape = wp.Tape()
    with tape:
        wp.launch(add, dim=6, inputs=arrays[:2], outputs=arrays[2:], device="cpu")
    tape.backward(grads={arrays[2]: wp.ones_like(arrays[2])})
    wp.launch(add, dim=6, inputs=[x, y], outputs=[z], device="cpu")  # no tape
    print(x[0].tolist(), z[0].tolist(), arrays[0].grad.numpy()[0].tolist())
