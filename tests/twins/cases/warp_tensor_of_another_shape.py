"""Issue 19 item 13: a (4, 1) tensor for a 1-D ``float`` parameter under a Tape: Warp takes
it, but ``wp.from_torch`` gives a 2-D array the kernel cannot take, so it is left as it
is; the event must say it was not converted (tape.backward() still changes it)."""

import torch
import warp as wp

TWIN = {
    "libraries": ["warp-1.5.1"],
    "modes": {"fix": {"events": ["warp_torch_args/not_converted"]}},
}


@wp.kernel
def double(x: wp.array(dtype=float), z: wp.array(dtype=float)):
    i = wp.tid()
    z[i] = x[i] * 2.0


def main():
    wp.config.quiet = True
    wp.init()
    x, z = torch.ones(4, 1), torch.zeros(4)
    wp_z = wp.from_torch(z, requires_grad=True)
    tape = wp.Tape()
    with tape:
        wp.launch(double, dim=4, inputs=[x], outputs=[wp_z], device="cpu")
    tape.backward(grads={wp_z: wp.ones_like(wp_z)})
    print("x", x.flatten().tolist(), "z", z.tolist())
