"""Warp 1.19.0 fixed NVIDIA/warp#394: a torch tensor under a Tape is left alone there, and
the guard does not patch that version."""

import contextlib
import io

import torch
import warp as wp

# warp_tape wraps wp.launch on every version: off here, so that "patched" is this guard's
TWIN = {
    "libraries": ["warp-1.19.0"],
    "policy": """
        extends = "default"
        disable = ["warp_tape"]
    """,
}


@wp.kernel
def add(x: wp.array(dtype=wp.vec3), z: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    z[i] = x[i] + x[i]


def main():
    with contextlib.redirect_stdout(io.StringIO()):  # 1.19 prints timings even when quiet
        wp.init()
        x, z = torch.ones(4, 3), torch.zeros(4, 3)
        wp_z = wp.from_torch(z, dtype=wp.vec3, requires_grad=True)
        tape = wp.Tape()
        with tape:
            wp.launch(add, dim=4, inputs=[x], outputs=[wp_z], device="cpu")
        tape.backward(grads={wp_z: wp.ones_like(wp_z)})
    print("x", x[0].tolist(), "z", z[0].tolist(), "patched", hasattr(wp.launch, "__wrapped__"))
