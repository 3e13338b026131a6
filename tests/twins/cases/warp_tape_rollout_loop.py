"""Correct Warp code in the shape of Warp's examples, on the newest warp-lang: a
multi-launch rollout (each step writes the next state, the next launch reads it), a loss
accumulated with wp.atomic_add over two launches, one tape reused with tape.reset(), the
state buffers reassigned after backward(): bit-identical and silent in every mode."""

import contextlib
import io

import numpy as np
import warp as wp

TWIN = {"libraries": ["warp-1.19.0"], "modes": ["fix", "observe", "strict"]}
STEPS, N = 8, 16


@wp.kernel
def integrate(
    x: wp.array(dtype=wp.vec2),
    v: wp.array(dtype=wp.vec2),
    force: wp.array(dtype=wp.vec2),
    x_next: wp.array(dtype=wp.vec2),
    v_next: wp.array(dtype=wp.vec2),
):
    i = wp.tid()
    v_next[i] = v[i] + 0.1 * (force[0] - 0.5 * x[i])
    x_next[i] = x[i] + 0.1 * v_next[i]


@wp.kernel
def distance(x: wp.array(dtype=wp.vec2), target: wp.vec2, loss: wp.array(dtype=float)):
    i = wp.tid()
    wp.atomic_add(loss, 0, wp.length_sq(x[i] - target))


@wp.kernel
def step_force(force: wp.array(dtype=wp.vec2), grad: wp.array(dtype=wp.vec2)):
    force[0] = force[0] - 0.002 * grad[0]


def main():
    rng = np.random.default_rng(1)
    start = rng.uniform(-1.0, 1.0, (N, 2))
    with contextlib.redirect_stdout(io.StringIO()):  # 1.19 prints module load timings
        wp.init()
        xs = [wp.zeros(N, dtype=wp.vec2, requires_grad=True) for _ in range(STEPS + 1)]
        vs = [wp.zeros(N, dtype=wp.vec2, requires_grad=True) for _ in range(STEPS + 1)]
        force = wp.zeros(1, dtype=wp.vec2, requires_grad=True)
        loss = wp.zeros(1, dtype=float, requires_grad=True)
        tape = wp.Tape()
        history = []
        for _ in range(12):
            xs[0].assign(start)  # reused after backward()
            vs[0].zero_()
            loss.zero_()
            with tape:
                for s in range(STEPS):
                    wp.launch(
                        integrate,
                        dim=N,
                        inputs=[xs[s], vs[s], force],
                        outputs=[xs[s + 1], vs[s + 1]],
                    )
                wp.launch(distance, dim=N, inputs=[xs[STEPS], wp.vec2(1.0, 0.5)], outputs=[loss])
                wp.launch(
                    distance, dim=N, inputs=[xs[STEPS // 2], wp.vec2(0.5, 0.0)], outputs=[loss]
                )
            tape.backward(loss)
            wp.launch(step_force, dim=1, inputs=[force, force.grad])
            history.append((loss.numpy()[0].item(), force.numpy()[0].tolist()))
            tape.zero()
            tape.reset()
    for entry in history:
        print(entry)
