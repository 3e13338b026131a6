"""The Warp guards' checks on CUDA, for a machine with an NVIDIA GPU.

    python scripts/gpu_warp.py [WARP_FOLDER ...]

Each folder holds a warp-lang install (``pip install --no-deps --target DIR warp-lang==X``;
give 1.5.1, 1.16.0, 1.17.0 and the newest); with none given, the installed warp is used.
For each, in a child interpreter, all on ``cuda``:

- warp_torch_args: the reproduction unguarded and guarded (convert, snapshot, strict),
  and bridge_grads against the analytic gradient;
- warp_tape and warp_copy_adjoint: the two fits of tests/test_warp_tape.py and
  tests/test_warp_tape_copy.py (a validation pass reusing the prediction buffer; a
  rollout through ``wp.clone``), unguarded and in fix, each against its reference (fresh
  buffers; a kernel copy), and Warp's idioms (``wp.ScopedCapture`` of a tape's forward and
  backward, replayed) bit-identical and silent in fix.

Prints one line per check; exits 1 if any expected result is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from thirdparty import first_on_path

CHILD = """
import json, os, torch
import autograd_guard
policy = json.loads(os.environ["TEST_POLICY"])
if policy is not None:
    autograd_guard.install(policy)
import warp as wp
wp.config.quiet = True
wp.init()

@wp.kernel
def k(x: wp.array(dtype=wp.vec3), y: wp.array(dtype=wp.vec3), z: wp.array(dtype=wp.vec3)):
    i = wp.tid(); z[i] = x[i] + y[i]

@wp.kernel
def square(x: wp.array(dtype=wp.vec3), z: wp.array(dtype=wp.vec3)):
    i = wp.tid(); z[i] = wp.cw_mul(x[i], x[i])

out = {"version": wp.config.version}
x = torch.ones((10, 3), device="cuda"); y = torch.ones((10, 3), device="cuda")
z = torch.zeros((10, 3), device="cuda")
wp_y = wp.from_torch(y, dtype=wp.vec3, requires_grad=True)
wp_z = wp.from_torch(z, dtype=wp.vec3, requires_grad=True)
tape = wp.Tape()
try:
    with tape:
        wp.launch(k, dim=10, inputs=[x, wp_y], outputs=[wp_z], device="cuda")
    tape.backward(grads={wp_z: wp.ones_like(wp_z)})
    wp.synchronize()
    out["x"] = x[0].tolist()
except Exception as exc:
    out["error"] = type(exc).__name__
a = torch.arange(15.0, device="cuda").reshape(5, 3).requires_grad_()
z = torch.zeros((5, 3), device="cuda"); wp_z = wp.from_torch(z, dtype=wp.vec3, requires_grad=True)
tape = wp.Tape()
try:
    with tape:
        wp.launch(square, dim=5, inputs=[a], outputs=[wp_z], device="cuda")
    tape.backward(grads={wp_z: wp.ones_like(wp_z)})
    wp.synchronize()
    out["bridge_ok"] = a.grad is not None and bool(torch.equal(a.grad, 2 * a.detach()))
except Exception as exc:
    out["bridge_error"] = f"{type(exc).__name__}: {str(exc)[:80]}"
print(json.dumps(out))
"""

CASES = [
    ("unguarded", None),
    ("convert", {}),
    ("snapshot", {"guards": {"warp_torch_args": {"action": "snapshot"}}}),
    ("strict", {"mode": "strict"}),
    ("bridge_grads", {"guards": {"warp_torch_args": {"bridge_grads": True}}}),
]


# The fits on CUDA: warp_tape (a reused prediction buffer; reference: a fresh one) and
# warp_copy_adjoint (a rollout through wp.clone; reference: a kernel copy).
TAPE_CHILD = """
import json, os
import numpy as np
import autograd_guard
from autograd_guard.testing import capture_events
policy = json.loads(os.environ["TEST_POLICY"])
if policy is not None:
    autograd_guard.install(policy)
import warp as wp
import warp.optim
wp.config.quiet = True
wp.init()
D = "cuda"

@wp.kernel
def predict(w: wp.array(dtype=float), x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid(); y[i] = w[0] * x[i] + w[1]

@wp.kernel
def sq_loss(y: wp.array(dtype=float), t: wp.array(dtype=float), loss: wp.array(dtype=float)):
    i = wp.tid(); d = y[i] - t[i]; wp.atomic_add(loss, 0, d * d)

@wp.kernel
def copy_kernel(q: wp.array(dtype=float), c: wp.array(dtype=float)):
    i = wp.tid(); c[i] = q[i]

@wp.kernel
def step(q: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid(); out[i] = q[i] + 0.3 * wp.sin(q[i])

def arr(values, grad=False):
    return wp.array(values, dtype=float, requires_grad=grad, device=D)

rng = np.random.default_rng(0)
xs = rng.uniform(-1, 1, 64); x, t = arr(xs), arr(3.0 * xs - 1.0)
xv = arr(rng.uniform(-1, 1, 64))

def fit_reuse(fresh):
    w, y, loss = arr([0.0, 0.0], True), arr([0.0] * 64, True), arr([0.0], True)
    optimizer = warp.optim.SGD([w], lr=0.005)
    for _ in range(60):
        loss.zero_()
        tape = wp.Tape()
        with tape:
            wp.launch(predict, 64, inputs=[w, x], outputs=[y], device=D)
            wp.launch(sq_loss, 64, inputs=[y, t], outputs=[loss], device=D)
        out = arr([0.0] * 64) if fresh else y
        wp.launch(predict, 64, inputs=[w, xv], outputs=[out], device=D)  # validation
        tape.backward(loss)
        optimizer.step([w.grad])
        tape.zero()
    return w.numpy().tolist()

def fit_clone(kernel_copy):
    p = arr(np.linspace(-1.0, 1.0, 16), True)
    target = arr(np.linspace(0.5, 2.5, 16))
    optimizer = warp.optim.SGD([p], lr=0.02)
    for _ in range(60):
        loss = arr([0.0], True)
        tape = wp.Tape()
        with tape:
            q = p
            for _ in range(6):
                if kernel_copy:
                    out = arr([0.0] * 16, True)
                    wp.launch(copy_kernel, 16, inputs=[q], outputs=[out], device=D)
                else:
                    out = wp.clone(q)
                wp.launch(step, 16, inputs=[q], outputs=[out], device=D)
                q = out
            wp.launch(sq_loss, 16, inputs=[q, target], outputs=[loss], device=D)
        tape.backward(loss)
        optimizer.step([p.grad])
        tape.zero()
    return p.numpy().tolist()

def captured():
    w, y, loss = arr([1.0, 0.5], True), arr([0.0] * 64, True), arr([0.0], True)
    wp.launch(predict, 64, inputs=[w, x], outputs=[y], device=D)  # load the module first
    with wp.ScopedCapture(device=D) as capture:
        tape = wp.Tape()
        with tape:
            wp.launch(predict, 64, inputs=[w, x], outputs=[y], device=D)
            wp.launch(sq_loss, 64, inputs=[y, t], outputs=[loss], device=D)
        tape.backward(loss)
    for _ in range(3):
        wp.capture_launch(capture.graph)
    wp.synchronize()
    return w.grad.numpy().tolist()

out = {"version": wp.config.version}
with capture_events() as events:
    out["reused"], out["cloned"], out["captured"] = fit_reuse(False), fit_clone(False), captured()
out["fresh"], out["kernel_copy"] = fit_reuse(True), fit_clone(True)
out["events"] = sorted({e["guard"] + "/" + e["action"] for e in events})
print(json.dumps(out))
"""


def _close(a: list[float], b: list[float]) -> bool:
    return all(abs(x - y) <= 1e-5 + 1e-5 * abs(y) for x, y in zip(a, b, strict=True))


def tape_checks(folder: str, work: Path) -> int:
    """The fits and the capture, unguarded and in fix; the number of failures."""
    script = work / "tape_child.py"
    script.write_text(TAPE_CHILD)
    results = {}
    for name, policy in (("unguarded", None), ("fix", {"mode": "fix"})):
        env = {**os.environ, "TEST_POLICY": json.dumps(policy)}
        env["WARP_CACHE_PATH"] = str(work / "cache")
        if folder:
            env["PYTHONPATH"] = first_on_path(folder)
        child = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True
        )
        lines = child.stdout.strip().splitlines()
        results[name] = json.loads(lines[-1]) if lines else {"error": child.stderr[-2000:]}
    fixed, plain = results["fix"], results["unguarded"]
    version = fixed.get("version", "?")
    copy_bug = version.startswith(tuple(f"1.{minor}." for minor in range(1, 17)))
    checks = {
        "warp_tape fit = fresh buffers": _close(fixed.get("reused", []), fixed.get("fresh", [])),
        "warp_copy_adjoint fit = kernel copy": _close(
            fixed.get("cloned", []), fixed.get("kernel_copy", [])
        ),
        "ScopedCapture bit-identical": fixed.get("captured") == plain.get("captured"),
        "events": set(fixed.get("events", []))
        == {"warp_tape/overwritten", *(["warp_copy_adjoint/replace_adjoint"] if copy_bug else [])},
    }
    for check, ok in checks.items():
        print(f"warp {version:<8} {check:<40} {'ok ' if ok else 'FAIL'}")
    print(f"  unguarded: {json.dumps(plain)[:600]}")
    print(f"  fix:       {json.dumps(fixed)[:600]}")
    return sum(not ok for ok in checks.values())


def main() -> int:
    folders = sys.argv[1:] or [""]
    work = Path(tempfile.mkdtemp(prefix="gpu-warp-"))
    script = work / "child.py"  # Warp reads kernel source from a file
    script.write_text(CHILD)
    failures = 0
    for folder in folders:
        for name, policy in CASES:
            env = {
                **os.environ,
                "TEST_POLICY": json.dumps(policy),
                "WARP_CACHE_PATH": str(work / "cache"),
            }
            if folder:
                env["PYTHONPATH"] = first_on_path(folder)
            child = subprocess.run(
                [sys.executable, str(script)], env=env, capture_output=True, text=True
            )
            line = child.stdout.strip().splitlines()[-1] if child.stdout.strip() else "{}"
            result = json.loads(line)
            version = result.get("version", "?")
            affected = version.startswith(("1.3", "1.4", "1.5"))
            expect = {
                "unguarded": result.get("x") == ([2.0] * 3 if affected else [1.0] * 3),
                "convert": result.get("x") == [1.0] * 3,
                "snapshot": result.get("x") == [1.0] * 3,
                "strict": result.get("error") == "GuardError" if affected else "x" in result,
                "bridge_grads": result.get("bridge_ok") is True,
            }[name]
            failures += not expect
            print(f"warp {version:<8} {name:<13} {'ok ' if expect else 'FAIL'} {line}")
            if child.returncode and not expect:
                print(child.stderr[-2000:])
        failures += tape_checks(folder, work)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
