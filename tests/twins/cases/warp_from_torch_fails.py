"""Issue 19 item 13: a float64 tensor for a ``vec3`` parameter under a Tape; ``wp.from_torch``
cannot convert it, so the guard must not say it did: the launch fails as unguarded."""

import torch
import warp as wp

TWIN = {
    "libraries": ["warp-1.5.1"],
    "modes": {"fix": {"events": ["warp_torch_args/not_converted"]}},
}


@wp.kernel
def double(x: wp.array(dtype=wp.vec3), z: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    z[i] = x[i] * 2.0


def main():
    wp.config.quiet = True
    wp.init()
    x, z = torch.ones(4, 3, dtype=torch.float64), torch.zeros(4, 3)
    wp_z = wp.from_torch(z, dtype=wp.vec3, requires_grad=True)
    with wp.Tape():
        wp.launch(double, dim=4, inputs=[x], outputs=[wp_z], device="cpu")
