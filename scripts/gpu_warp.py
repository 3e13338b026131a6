"""The warp_torch_args checks on CUDA, for a machine with an NVIDIA GPU.

    python scripts/gpu_warp.py [WARP_FOLDER ...]

Each folder holds a warp-lang install (``pip install --no-deps --target DIR warp-lang==X``);
with none given, the installed warp is used. For each, in a child interpreter: the
issue's reproduction unguarded and guarded (convert, snapshot, strict), and bridge_grads
against the analytic gradient, all on ``cuda``. Prints one line per check; exits 1 if
any expected result is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

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
                env["PYTHONPATH"] = folder
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
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
