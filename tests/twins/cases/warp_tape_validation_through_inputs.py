"""The validation pass of NVIDIA/warp#1350 in the form Warp's own examples use: every array
passed in ``inputs=``, the prediction buffer too (a kernel may write any array argument).
A linear fit logs its validation loss through the same prediction buffer between the
tape's recording and its backward(): unguarded the fit goes wrong, silently. fix gives the
gradient of the program as written (the fit with a fresh validation buffer, the hand fix);
observe names the overwrite; strict raises at backward()."""

import contextlib
import io
import os

import numpy as np
import warp as wp

TWIN = {
    "libraries": ["warp-1.5.1"],
    "modes": {
        "fix": {"events": ["warp_tape/overwritten"], "like": "handfix"},
        "observe": {"events": ["warp_tape/overwritten"]},
        "strict": {
            "events": ["warp_tape/overwritten"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}
N = 128


@wp.kernel
def predict(x: wp.array2d(dtype=float), w: wp.array(dtype=float), pred: wp.array(dtype=float)):
    i = wp.tid()
    s = float(0.0)  # noqa: UP018 (Warp: a variable a loop changes is declared typed)
    for j in range(3):
        s += x[i, j] * w[j]
    pred[i] = s


@wp.kernel
def mse(pred: wp.array(dtype=float), y: wp.array(dtype=float), loss: wp.array(dtype=float)):
    i = wp.tid()
    d = pred[i] - y[i]
    wp.atomic_add(loss, 0, d * d / float(N))


@wp.kernel
def step(w: wp.array(dtype=float), g: wp.array(dtype=float), rate: float):
    i = wp.tid()
    w[i] = w[i] - rate * g[i]


def main():
    lines = []
    with contextlib.redirect_stdout(io.StringIO()):  # Warp prints its module loads
        wp.config.quiet = True
        wp.init()
        rng = np.random.default_rng(0)
        xs, xv = rng.normal(size=(N, 3)), rng.normal(size=(N, 3))
        true_w = np.array([1.5, -2.0, 0.5])
        x, y = wp.array(xs, dtype=float), wp.array(xs @ true_w, dtype=float)
        x_val, y_val = wp.array(xv, dtype=float), wp.array(xv @ true_w, dtype=float)
        w = wp.zeros(3, dtype=float, requires_grad=True)
        pred = wp.zeros(N, dtype=float, requires_grad=True)
        loss, val_loss = wp.zeros(1, dtype=float, requires_grad=True), wp.zeros(1, dtype=float)
        fresh = wp.zeros(N, dtype=float)
        for epoch in range(40):
            loss.zero_()
            val_loss.zero_()
            tape = wp.Tape()
            with tape:
                wp.launch(predict, dim=N, inputs=[x, w, pred])
                wp.launch(mse, dim=N, inputs=[pred, y, loss])
            out = fresh if os.environ.get("TWIN_HANDFIX") else pred
            wp.launch(predict, dim=N, inputs=[x_val, w, out])  # the validation pass
            wp.launch(mse, dim=N, inputs=[out, y_val, val_loss])
            tape.backward(loss)
            wp.launch(step, dim=3, inputs=[w, w.grad, 0.1])
            tape.zero()
            if epoch % 10 == 0:
                lines.append(f"{epoch} {float(val_loss.numpy()[0]):.5f}")
        lines.append(str([round(v, 4) for v in w.numpy().tolist()]))
    print("\n".join(lines))
