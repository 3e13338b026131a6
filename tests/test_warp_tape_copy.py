"""Guard warp_copy_adjoint against real Warp on CPU: 1.16.0 (affected), 1.17.0 (the fix)
and 1.19.0, each in child interpreters of its own: the reproduction in every mode, and a
60-step fit through ``wp.clone`` against the same fit through a kernel copy."""

from __future__ import annotations

import pytest
from helpers import guard_state
from test_warp import PREAMBLE, run

AFFECTED, FIXED = "1.16.0", ["1.17.0", "1.19.0"]


@pytest.fixture(scope="module")
def warp_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("warp-copy-kernel-cache"))


KERNELS = """
@wp.kernel
def double(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid(); y[i] = x[i] * 2.0

@wp.kernel
def total(x: wp.array(dtype=float), loss: wp.array(dtype=float)):
    i = wp.tid(); wp.atomic_add(loss, 0, x[i])

def arr(values, grad=True):
    return wp.array(values, dtype=float, requires_grad=grad)
"""

# Two programs whose gradient a recorded copy gets wrong: its source read again later
# (d loss / dx = 1 + 2), and a launch's write that the copy makes dead (d loss / dx = 0).
REPRO = (
    PREAMBLE
    + KERNELS
    + """
result = {"version": wp.config.version}
with capture_events() as events:
    try:
        x, y, z, loss = arr([1.0, 2.0]), arr([0.0, 0.0]), arr([0.0, 0.0]), arr([0.0])
        tape = wp.Tape()
        with tape:
            wp.copy(y, x)  # COPY
            wp.launch(double, 2, inputs=[x], outputs=[z])
            wp.launch(total, 2, inputs=[y], outputs=[loss])
            wp.launch(total, 2, inputs=[z], outputs=[loss])
        tape.backward(loss)
        result["read_again"] = x.grad.numpy().tolist()
        x, y, s, loss = arr([1.0, 2.0]), arr([0.0, 0.0]), arr([5.0, 6.0]), arr([0.0])
        tape = wp.Tape()
        with tape:
            wp.launch(double, 2, inputs=[x], outputs=[y])
            y.assign(s)  # ASSIGN: a copy
            wp.launch(total, 2, inputs=[y], outputs=[loss])
        tape.backward(loss)
        result["dead_write"] = x.grad.numpy().tolist()
        result["s"] = s.grad.numpy().tolist()
        result["values"] = y.numpy().tolist()
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
result["events"] = events
result["status"] = autograd_guard.status()
print(json.dumps(result, default=str))
"""
)
RIGHT = {"read_again": [3.0, 3.0], "dead_write": [0.0, 0.0], "s": [1.0, 1.0]}


def lines(marker: str) -> str:
    return f"repro.py:{next(i for i, t in enumerate(REPRO.splitlines(), 1) if marker in t)}"


def test_affected_version_unguarded_gives_the_wrong_gradients(tmp_path, warp_cache):
    result = run(AFFECTED, None, tmp_path, warp_cache, script=REPRO)
    assert result["version"] == AFFECTED
    assert result["read_again"] == [1.0, 1.0]  # the later launch's contribution overwritten
    assert result["dead_write"] == [2.0, 2.0]  # the dead write's gradient leaked


@pytest.mark.parametrize("mode", ["observe", "fix", "strict"])
def test_affected_version_guarded(tmp_path, warp_cache, mode):
    unguarded = run(AFFECTED, None, tmp_path, warp_cache, script=REPRO)
    result = run(AFFECTED, {"mode": mode}, tmp_path, warp_cache, script=REPRO)
    if mode == "strict":
        assert result["error"].startswith("GuardError: autograd-guard [warp_copy_adjoint]")
        assert lines("# COPY") in result["error"]
        return
    expected = RIGHT if mode == "fix" else unguarded
    assert {k: result[k] for k in RIGHT} == {k: expected[k] for k in RIGHT}
    assert result["values"] == unguarded["values"] == [5.0, 6.0]  # the copies themselves
    sites = [(e["action"], e["callsite"]) for e in result["events"]]
    assert sites == [("replace_adjoint", lines("# COPY")), ("replace_adjoint", lines("# ASSIGN"))]
    said = "recorded with one that adds it" if mode == "fix" else "fix records one"
    assert all(said in e["event"] for e in result["events"])


@pytest.mark.parametrize("version", FIXED)
def test_fixed_versions_are_left_alone(tmp_path, warp_cache, version):
    result = run(version, {"mode": "fix"}, tmp_path, warp_cache, script=REPRO)
    assert {k: result[k] for k in RIGHT} == RIGHT  # Warp's own adjoint is right
    assert [e for e in result["events"] if e["guard"] == "warp_copy_adjoint"] == []
    state = guard_state("warp_copy_adjoint", result["status"])
    assert state == f"not needed for warp-lang {version}"


# The iterative pattern of the report, in the user's shape: out = wp.clone(q), a step that
# reads q and writes out, q = out; warp.optim.SGD, 60 steps. The reference copies with a
# kernel instead.
FIT = (
    PREAMBLE
    + """
import numpy as np
import warp.optim
N, K = 16, 6

@wp.kernel
def copy_kernel(q: wp.array(dtype=float), c: wp.array(dtype=float)):
    i = wp.tid(); c[i] = q[i]

@wp.kernel
def step(q: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid(); out[i] = q[i] + 0.3 * wp.sin(q[i])

@wp.kernel
def sq_loss(q: wp.array(dtype=float), t: wp.array(dtype=float), loss: wp.array(dtype=float)):
    i = wp.tid(); d = q[i] - t[i]; wp.atomic_add(loss, 0, d * d)

def fit(kernel_copy):
    p = wp.array(np.linspace(-1.0, 1.0, N), dtype=float, requires_grad=True)
    target = wp.array(np.linspace(0.5, 2.5, N), dtype=float)
    optimizer = warp.optim.SGD([p], lr=0.02)
    for _ in range(60):
        loss = wp.zeros(1, dtype=float, requires_grad=True)
        tape = wp.Tape()
        with tape:
            q = p
            for _ in range(K):
                if kernel_copy:
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
    return p.numpy().tolist(), float(loss.numpy()[0])

with capture_events() as events:
    cloned = fit(False)
print(json.dumps({"cloned": cloned, "reference": fit(True), "events": events}))
"""
)


@pytest.mark.parametrize("version", [AFFECTED, *FIXED])
def test_fit_through_clone_under_fix_is_the_fit_through_a_kernel_copy(
    tmp_path, warp_cache, version
):
    unguarded = run(version, None, tmp_path, warp_cache, script=FIT)
    (p_ref, loss_ref) = unguarded["reference"]
    assert loss_ref < 1e-3
    if version == AFFECTED:  # the copy's adjoint zeroes the gradient: the fit never moves
        assert unguarded["cloned"][1] > 60.0
    fixed = run(version, {"mode": "fix"}, tmp_path, warp_cache, script=FIT)
    assert fixed["cloned"][0] == pytest.approx(p_ref, rel=1e-6, abs=1e-7)
    assert fixed["cloned"][1] == pytest.approx(loss_ref, rel=1e-4, abs=1e-8)
    assert fixed["reference"] == unguarded["reference"]  # no copy there: untouched
    actions = [e["action"] for e in fixed["events"] if e["guard"] == "warp_copy_adjoint"]
    assert actions == (["replace_adjoint"] if version == AFFECTED else [])
