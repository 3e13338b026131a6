"""A fit whose validation pass reuses the prediction buffer between the tape's recording and
its backward() (NVIDIA/warp#1350): unguarded the gradient is read from the validation
values and the fit goes wrong, silently. fix gives the gradient of the program as written,
the fit of the same program with a fresh validation buffer (the hand fix); observe names
the overwrite and changes nothing; strict raises at backward()."""

import contextlib
import io
import os

import numpy as np
import warp as wp

TWIN = {
    "libraries": ["warp-1.19.0"],
    "modes": {
        "fix": {"events": ["warp_tape/overwritten"], "like": "handfix"},
        "observe": {"events": ["warp_tape/overwritten"]},
        "strict": {
            "events": ["warp_tape/overwritten"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


@wp.kernel
def predict(w: wp.array(dtype=float), x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = w[0] * x[i] + w[1]


@wp.kernel
def sq_loss(y: wp.array(dtype=float), t: wp.array(dtype=float), loss: wp.array(dtype=float)):
    i = wp.tid()
    d = y[i] - t[i]
    wp.atomic_add(loss, 0, d * d)


@wp.kernel
def sgd(w: wp.array(dtype=float), g: wp.array(dtype=float), rate: float):
    i = wp.tid()
    w[i] = w[i] - rate * g[i]


def main():
    lines = []
    with contextlib.redirect_stdout(io.StringIO()):  # Warp prints its module loads
        wp.config.quiet = True
        wp.init()
        xs = np.linspace(-1.0, 1.0, 64)
        x, t = wp.array(xs, dtype=float), wp.array(3.0 * xs - 1.0, dtype=float)
        xv = wp.array(xs + 0.5, dtype=float)
        w = wp.zeros(2, dtype=float, requires_grad=True)
        y = wp.zeros(64, dtype=float, requires_grad=True)
        loss = wp.zeros(1, dtype=float, requires_grad=True)
        fresh = wp.zeros(64, dtype=float)
        for step in range(60):
            loss.zero_()
            tape = wp.Tape()
            with tape:
                wp.launch(predict, 64, inputs=[w, x], outputs=[y])
                wp.launch(sq_loss, 64, inputs=[y, t], outputs=[loss])
            validation = fresh if os.environ.get("TWIN_HANDFIX") else y
            wp.launch(predict, 64, inputs=[w, xv], outputs=[validation])
            tape.backward(loss)
            wp.launch(sgd, 2, inputs=[w, w.grad, 0.005])
            tape.zero()
            if step % 20 == 0:
                lines.append(f"{step} {[round(v, 4) for v in w.numpy().tolist()]}")
        lines.append(str([round(v, 4) for v in w.numpy().tolist()]))
    print("\n".join(lines))
