"""Correct Warp code in the shape of Warp's examples, on 1.5.1: a single-launch loss
recorded on a fresh tape each step, the parameters updated by a kernel after backward()
(a buffer reused after backward), the loss accumulated with wp.atomic_add, tape.zero():
bit-identical and silent in every mode."""

import numpy as np
import warp as wp

TWIN = {"libraries": ["warp-1.5.1"], "modes": ["fix", "observe", "strict"]}


@wp.kernel
def loss_kernel(
    w: wp.array(dtype=float),
    x: wp.array(dtype=float),
    t: wp.array(dtype=float),
    loss: wp.array(dtype=float),
):
    i = wp.tid()
    d = w[0] * x[i] + w[1] - t[i]
    wp.atomic_add(loss, 0, d * d)


@wp.kernel
def sgd(w: wp.array(dtype=float), g: wp.array(dtype=float), rate: float):
    i = wp.tid()
    w[i] = w[i] - rate * g[i]


def main():
    wp.config.quiet = True
    wp.init()
    xs = np.linspace(-1.0, 1.0, 32)
    x = wp.array(xs, dtype=float)
    t = wp.array(2.0 * xs + 0.5, dtype=float)
    w = wp.zeros(2, dtype=float, requires_grad=True)
    loss = wp.zeros(1, dtype=float, requires_grad=True)
    for step in range(40):
        loss.zero_()
        tape = wp.Tape()
        with tape:
            wp.launch(loss_kernel, dim=32, inputs=[w, x, t], outputs=[loss])
        tape.backward(loss)
        wp.launch(sgd, dim=2, inputs=[w, w.grad, 0.01])
        tape.zero()
        if step % 10 == 0:
            print(step, loss.numpy().tolist(), w.numpy().tolist())
    print(w.numpy().tolist())
