"""An iterative fit through ``wp.clone`` on warp-lang 1.16.0, whose recorded ``wp.copy``
propagates a wrong adjoint (NVIDIA/warp#1728, fixed in 1.17.0): unguarded the gradient
never reaches the parameters and the fit does not move. fix records the copy with the
adjoint 1.17.0 uses: the fit of the same program with a kernel copy (the hand fix);
observe names it and changes nothing; strict raises at the copy."""

import contextlib
import io
import os

import numpy as np
import warp as wp
import warp.optim

TWIN = {
    "libraries": ["warp-1.16.0"],
    "modes": {
        "fix": {"events": ["warp_copy_adjoint/replace_adjoint"], "like": "handfix"},
        "observe": {"events": ["warp_copy_adjoint/replace_adjoint"]},
        "strict": {
            "events": ["warp_copy_adjoint/replace_adjoint"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}
N, K = 16, 4


@wp.kernel
def copy_kernel(q: wp.array(dtype=float), c: wp.array(dtype=float)):
    i = wp.tid()
    c[i] = q[i]


@wp.kernel
def step(q: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = q[i] + 0.3 * wp.sin(q[i])


@wp.kernel
def sq_loss(q: wp.array(dtype=float), t: wp.array(dtype=float), loss: wp.array(dtype=float)):
    i = wp.tid()
    d = q[i] - t[i]
    wp.atomic_add(loss, 0, d * d)


def main():
    lines = []
    with contextlib.redirect_stdout(io.StringIO()):  # Warp prints its module loads
        wp.config.quiet = True
        wp.init()
        p = wp.array(np.linspace(-1.0, 1.0, N), dtype=float, requires_grad=True)
        target = wp.array(np.linspace(0.5, 2.5, N), dtype=float)
        optimizer = warp.optim.SGD([p], lr=0.02)
        for it in range(50):
            loss = wp.zeros(1, dtype=float, requires_grad=True)
            tape = wp.Tape()
            with tape:
                q = p
                for _ in range(K):
                    if os.environ.get("TWIN_HANDFIX"):
                        out = wp.zeros(N, dtype=float, requires_grad=True)
                        wp.launch(copy_kernel, N, inputs=[q], outputs=[out])
                    else:
                        out = wp.clone(q)
                    wp.launch(step, N, inputs=[q], outputs=[out])
                    q = out
                wp.launch(sq_loss, N, inputs=[q, target], outputs=[loss])
            tape.backward(loss)
            optimizer.step([p.grad])
            tape.zero()
            if it % 10 == 0:
                lines.append(f"{it} {round(float(loss.numpy()[0]), 4)}")
        lines.append(str([round(v, 4) for v in p.numpy().tolist()]))
    print("\n".join(lines))
