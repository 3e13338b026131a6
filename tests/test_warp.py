"""Guard warp_torch_args against real Warp on CPU: 1.5.1 (affected) and 1.19.0 (fixed),
each in child interpreters of its own."""

from __future__ import annotations

import json
import sys

import pytest
import thirdparty
from helpers import assert_attached, guard_state, run_python

AFFECTED, NEWEST = "1.5.1", "1.19.0"
LAUNCH = {AFFECTED: "warp.context:launch", NEWEST: "warp._src.context:launch"}  # wp.launch

# Each child: the policy in TEST_POLICY (JSON; null: unguarded), then Warp on the CPU.
PREAMBLE = """
import json, os, torch
import autograd_guard
from autograd_guard.testing import capture_events
policy = json.loads(os.environ["TEST_POLICY"])
if policy is not None:
    autograd_guard.install(policy)
import warp as wp
wp.config.quiet = True
wp.init()
"""

# The reproduction from the issue, with cpu for cuda; prints a JSON line of results.
SCRIPT = (
    PREAMBLE
    + """

@wp.kernel
def k(x: wp.array(dtype=wp.vec3), y: wp.array(dtype=wp.vec3), z: wp.array(dtype=wp.vec3)):
    i = wp.tid(); z[i] = x[i] + y[i]

@wp.kernel
def square(x: wp.array(dtype=wp.vec3), m: wp.array(dtype=wp.mat33), s: wp.array2d(dtype=float),
           z: wp.array(dtype=wp.vec3)):
    i = wp.tid(); z[i] = wp.cw_mul(x[i], x[i]) + m[i] * x[i] + wp.vec3(s[i, 0])

@wp.kernel
def k_tiled(x: wp.array(dtype=wp.vec3), y: wp.array(dtype=wp.vec3), z: wp.array(dtype=wp.vec3)):
    i, j = wp.tid(); z[i] = x[i] + y[i]

result = {"version": wp.config.version}
with capture_events() as events:
    x = torch.ones((10, 3)); y = torch.ones((10, 3)); z = torch.zeros((10, 3))
    wp_y = wp.from_torch(y, dtype=wp.vec3, requires_grad=True)
    wp_z = wp.from_torch(z, dtype=wp.vec3, requires_grad=True)
    tape = wp.Tape()
    try:
        with tape:
            wp.launch(k, dim=10, inputs=[x, wp_y], outputs=[wp_z], device="cpu")  # LAUNCH
        tape.backward(grads={wp_z: wp.ones_like(wp_z)})
        result["x"] = x[0].tolist()
        result["z"] = z[0].tolist()
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"

    # Vector, matrix and 2-D parameters; x requires grad: bridged or a crash.
    x = torch.arange(15.0).reshape(5, 3).requires_grad_()
    m = torch.eye(3).repeat(5, 1, 1)
    s = torch.ones((5, 2))
    z = torch.zeros((5, 3)); wp_z = wp.from_torch(z, dtype=wp.vec3, requires_grad=True)
    tape = wp.Tape()
    try:
        with tape:
            wp.launch(square, dim=5, inputs=[x, m, s], outputs=[wp_z], device="cpu")
        tape.backward(grads={wp_z: wp.ones_like(wp_z)})
        result["grad"] = None if x.grad is None else x.grad.tolist()
        result["expected_grad"] = (2 * x.detach() + 1).tolist()
        result["m"], result["s"] = m[0].tolist(), s[0].tolist()
    except Exception as exc:
        result["grad_error"] = f"{type(exc).__name__}: {exc}"
    # wp.launch_tiled forwards to wp.launch through the module, so it is covered too.
    x = torch.ones((10, 3)); z = torch.zeros((10, 3))
    wp_z = wp.from_torch(z, dtype=wp.vec3, requires_grad=True)
    tape = wp.Tape()
    try:
        with tape:
            wp.launch_tiled(k_tiled, dim=[10], inputs=[x, wp_y], outputs=[wp_z], device="cpu",
                            block_dim=1)
        tape.backward(grads={wp_z: wp.ones_like(wp_z)})
        result["tiled_x"] = x[0].tolist()
    except Exception as exc:
        result["tiled_error"] = f"{type(exc).__name__}: {exc}"
result["events"] = events
result["wrapped"] = hasattr(wp.launch, "__wrapped__")
result["status"] = autograd_guard.status()
print(json.dumps(result, default=str))
"""
)


@pytest.fixture(scope="module")
def warp_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("warp-kernel-cache"))


def run(version, policy, tmp_path, warp_cache, script=None):
    folder = thirdparty.install(f"warp-{version}")
    (tmp_path / "repro.py").write_text(script or SCRIPT)
    code = "import runpy, sys; runpy.run_path('repro.py', run_name='__main__')"
    out = run_python(
        sys.executable,
        code,
        tmp_path,
        PYTHONPATH=str(folder),
        WARP_CACHE_PATH=warp_cache,
        TEST_POLICY=json.dumps(policy),
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def line_of_launch() -> int:
    # SCRIPT starts with a newline, which the written file keeps as its line 1.
    return next(i for i, line in enumerate(SCRIPT.splitlines(), 1) if "# LAUNCH" in line)


def test_affected_version_corrupts_unguarded(tmp_path, warp_cache):
    result = run(AFFECTED, None, tmp_path, warp_cache)
    assert result["version"] == AFFECTED
    assert result["x"] == [2.0, 2.0, 2.0]  # the gradient was added into the caller's tensor
    assert result["tiled_x"] == [2.0, 2.0, 2.0]
    assert "Can't call numpy() on Tensor that requires grad" in result["grad_error"]


@pytest.mark.parametrize("action", ["convert", "snapshot"])
def test_affected_version_guarded(tmp_path, warp_cache, action):
    result = run(
        AFFECTED, {"guards": {"warp_torch_args": {"action": action}}}, tmp_path, warp_cache
    )
    assert result["x"] == [1.0, 1.0, 1.0] and result["z"] == [2.0, 2.0, 2.0]
    assert result["tiled_x"] == [1.0, 1.0, 1.0]
    first, second, _tiled = [e for e in result["events"] if e["action"] == action]
    assert first["arguments"] == ["x"] and first["callsite"] == f"repro.py:{line_of_launch()}"
    assert second["arguments"] == ["m", "s"]  # matrix and 2-D parameters; x requires grad
    if action == "snapshot":
        restored, tiled = [e for e in result["events"] if e["action"] == "snapshot_restored"]
        assert tiled["changes"][0]["argument"] == "x"
        assert restored["changes"][0]["argument"] == "x"
        assert restored["changes"][0]["max_abs_change"] == 1.0
    assert "grad_error" in result  # without bridge_grads, requires_grad still fails as before


def test_affected_version_strict_raises_before_the_launch(tmp_path, warp_cache):
    result = run(AFFECTED, {"mode": "strict"}, tmp_path, warp_cache)
    assert result["error"].startswith("GuardError")
    assert "['x']" in result["error"] and "wp.from_torch" in result["error"]
    assert "x" not in result


def test_newest_version_is_left_alone(tmp_path, warp_cache):
    unguarded = run(NEWEST, None, tmp_path, warp_cache)
    # warp_tape wraps wp.launch on every version: off here, so that the check is this guard's
    guarded = run(NEWEST, {"disable": ["warp_tape"]}, tmp_path, warp_cache)
    assert unguarded["version"] == NEWEST
    assert unguarded["x"] == guarded["x"] == [1.0, 1.0, 1.0]
    assert guarded["events"] == [] and guarded["wrapped"] is False
    state = guard_state("warp_torch_args", guarded["status"])
    assert state == f"not needed for warp-lang {NEWEST}"  # the gate ran and declined
    assert "Can't call numpy()" in guarded["grad_error"]


@pytest.mark.parametrize("version", [AFFECTED, NEWEST])
def test_bridge_grads_fills_the_analytic_gradient(tmp_path, warp_cache, version):
    policy = {"guards": {"warp_torch_args": {"bridge_grads": True}}}
    result = run(version, policy, tmp_path, warp_cache)
    assert result["grad"] == result["expected_grad"]  # d/dx sum(x*x + I x + s) = 2x + 1
    assert result["m"] == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    assert result["s"] == [1.0, 1.0]  # the inputs that did not require grad are unchanged
    assert result["x"] == [1.0, 1.0, 1.0]
    [bridge] = [e for e in result["events"] if e["action"] == "bridge_grads"]
    assert bridge["arguments"] == ["x"]
    # its remedy is the conversion by hand: an upgrade would drop the gradient, not fill it
    assert "requires_grad=True" in bridge["remedy"] and "upgrade" not in bridge["remedy"]


# Correct code: Warp arrays under a tape, torch tensors without one, wp.from_torch by hand.
CORRECT = """
import json, os, torch
import autograd_guard
from autograd_guard.testing import capture_events
autograd_guard.install(json.loads(os.environ["TEST_POLICY"]))
import warp as wp
wp.config.quiet = True
wp.init()

@wp.kernel
def k(x: wp.array(dtype=wp.vec3), y: wp.array(dtype=wp.vec3), z: wp.array(dtype=wp.vec3)):
    i = wp.tid(); z[i] = x[i] + y[i]

with capture_events() as events:
    x = torch.ones((10, 3)); y = torch.ones((10, 3)); z = torch.zeros((10, 3))
    wp_x = wp.from_torch(x, dtype=wp.vec3, requires_grad=True)
    wp_y = wp.from_torch(y, dtype=wp.vec3, requires_grad=True)
    wp_z = wp.from_torch(z, dtype=wp.vec3, requires_grad=True)
    tape = wp.Tape()
    with tape:
        wp.launch(k, dim=10, inputs=[wp_x, wp_y], outputs=[wp_z], device="cpu")
    tape.backward(grads={wp_z: wp.ones_like(wp_z)})
    wp.launch(k, dim=10, inputs=[x, y], outputs=[z], device="cpu")  # no tape: nothing to fear
result = {"x": x[0].tolist(), "z": z[0].tolist(), "events": events}
print(json.dumps({**result, "status": autograd_guard.status()}, default=str))
"""


@pytest.mark.parametrize("version", [AFFECTED, NEWEST])
@pytest.mark.parametrize("mode", ["fix", "strict"])
def test_correct_warp_code_is_silent(tmp_path, warp_cache, version, mode):
    policy = {"mode": mode, "guards": {"warp_torch_args": {"bridge_grads": True}}}
    result = run(version, policy, tmp_path, warp_cache, script=CORRECT)
    assert_attached("warp_torch_args", LAUNCH[version], status=result["status"])
    assert result["x"] == [1.0, 1.0, 1.0] and result["z"] == [2.0, 2.0, 2.0]
    assert result["events"] == []


# bridge_grads on a leaf, a non-leaf and a non-leaf that retains its gradient, each under a
# Tape of its own; every warning is recorded, and every .grad read without one.
BRIDGE = (
    PREAMBLE
    + """
import warnings

@wp.kernel
def square(x: wp.array(dtype=float), z: wp.array(dtype=float)):
    i = wp.tid(); z[i] = x[i] * x[i]

def output():
    return wp.from_torch(torch.zeros(4), requires_grad=True)

def backward(tape, wp_z):
    tape.backward(grads={wp_z: wp.ones_like(wp_z)})

def error(exc):
    return [type(exc).__name__, str(exc).splitlines()[0]]

def grad(t):
    return None if t.grad is None else t.grad.tolist()

result = {}
with warnings.catch_warnings(record=True) as caught, capture_events() as events:
    warnings.simplefilter("always")
    leaf = torch.arange(4.0, requires_grad=True)
    wp_z, tape = output(), wp.Tape()
    try:
        with tape:
            wp.launch(square, dim=4, inputs=[leaf], outputs=[wp_z], device="cpu")
        backward(tape, wp_z)
    except Exception as exc:
        result["leaf_error"] = error(exc)
    result["leaf_grad"] = grad(leaf)

    p = torch.arange(4.0, requires_grad=True)
    x = p * 1.0  # not a leaf: Warp's gradient in x.grad would never reach p
    wp_z, tape = output(), wp.Tape()
    try:
        with tape:
            wp.launch(square, dim=4, inputs=[x], outputs=[wp_z], device="cpu")
        backward(tape, wp_z)
    except Exception as exc:
        result["non_leaf_error"] = error(exc)
    result["non_leaf_p_grad"], result["non_leaf_retains"] = grad(p), x.retains_grad

    q = torch.arange(4.0, requires_grad=True)
    y = q * 1.0
    y.retain_grad()  # the user asked for y.grad: it can be bridged, then sent on to q
    wp_z, tape = output(), wp.Tape()
    try:
        with tape:
            wp.launch(square, dim=4, inputs=[y], outputs=[wp_z], device="cpu")
        backward(tape, wp_z)
        result["retained_grad"] = grad(y)
        y.backward(y.grad)
    except Exception as exc:
        result["retained_error"] = error(exc)
        result["retained_grad"] = grad(y)
    result["retained_q_grad"] = grad(q)
result["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
result["events"] = events
print(json.dumps(result, default=str))
"""
)
EXPECTED_GRAD = [0.0, 2.0, 4.0, 6.0]  # d/dx sum(x * x) = 2x at x = 0, 1, 2, 3
BRIDGES = {"bridge_grads": True}


def bridge_run(version, mode, tmp_path, warp_cache):
    policy = None if mode is None else {"mode": mode, "guards": {"warp_torch_args": BRIDGES}}
    return run(version, policy, tmp_path, warp_cache, script=BRIDGE)


@pytest.mark.parametrize("version", [AFFECTED, NEWEST])
def test_bridge_grads_leaves_unguarded_warnings_and_grads_alone(tmp_path, warp_cache, version):
    unguarded = bridge_run(version, None, tmp_path, warp_cache)
    # Unguarded, Warp rejects every tensor that requires grad, and no .grad is set.
    for case in ("leaf", "non_leaf", "retained"):
        assert "Can't call numpy() on Tensor that requires grad" in unguarded[f"{case}_error"][1]
    assert unguarded["leaf_grad"] is unguarded["retained_grad"] is None
    for mode in ("observe", "strict", "fix"):
        guarded = bridge_run(version, mode, tmp_path, warp_cache)
        assert guarded["warnings"] == unguarded["warnings"], mode  # no .grad warning of ours
        # The non-leaf is left to Warp in every mode: the same error, p untouched, and named.
        assert guarded["non_leaf_error"] == unguarded["non_leaf_error"], mode
        assert guarded["non_leaf_p_grad"] is None and guarded["non_leaf_retains"] is False
        [named] = [e for e in guarded["events"] if e["action"] == "not_bridged"]
        assert named["arguments"] == ["x"] and "t.retain_grad()" in named["remedy"]
        bridged = [e["arguments"] for e in guarded["events"] if e["action"] == "bridge_grads"]
        if mode == "fix":
            continue
        # Decided, not done: nothing converted, so every .grad stays None as unguarded.
        assert guarded["leaf_grad"] is guarded["retained_grad"] is None, mode
        assert guarded["retained_q_grad"] is None
        assert bridged == [["x"], ["x"]]  # the leaf and the retaining non-leaf
        raised = "GuardError" if mode == "strict" else "RuntimeError"
        assert guarded["leaf_error"][0] == guarded["retained_error"][0] == raised
    # fix: the leaf gets Warp's gradient; the retaining non-leaf too, and torch sends it on.
    assert "leaf_error" not in guarded and "retained_error" not in guarded
    assert guarded["leaf_grad"] == guarded["retained_grad"] == EXPECTED_GRAD
    assert guarded["retained_q_grad"] == EXPECTED_GRAD
    assert bridged == [["x"], ["x"]]
