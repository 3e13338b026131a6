"""grad_health's repair at the origin on CUDA, for a machine with an NVIDIA GPU.

    python scripts/gpu_grad_health_repair.py [--cpu: a dry run of the script on the CPU]

The CPU suite proves the repair on real singular points (``tests/test_grad_health_repair.py``)
and that a repairing backward pass reads nothing on the host, counted by every way a tensor
reaches it (its stand-in for "no host sync"). This runs two of those fits on CUDA, each in
a child interpreter of its own:

- ``soft_distance``: ``log`` of a kernel sum that underflows to exactly 0 (its backward is
  0/0); the reference is the documented fix, ``torch.where`` on a safe input;
- ``masked_attention``: softmax over a fully masked query row (NaN in the forward pass,
  left out of the loss); the reference fills with -1e9 instead of ``-inf``.

For each: the guarded run of the unfixed program must say ``nonfinite_repaired`` and end
within tolerance of the unguarded reference (final loss within 5%, solution within the
CPU test's tolerance), and a repairing step must make no more host syncs (torch's sync
debug mode) than a healthy guarded step of the reference program. Exits 1 if any check
fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_grad_health import run_child

TESTS = Path(__file__).resolve().parent.parent / "tests"  # the fits: grad_health_singular.py

CHILD = r"""
import json, os, sys, warnings, torch
sys.path.insert(0, os.environ["TESTS"])
import grad_health_singular as singular
import autograd_guard
from autograd_guard.testing import capture_events
FIT, DEVICE = os.environ["FIT"], os.environ["DEVICE"]
if os.environ["GUARDED"] == "1":
    autograd_guard.install({})
STEPS = {"soft_distance": 300, "masked_attention": 150}[FIT]
ON_CUDA, caught = DEVICE == "cuda", warnings.catch_warnings(record=True)

def each_step(step):  # the last 20 steps (repair long begun) count host syncs
    if step == STEPS - 20:
        if ON_CUDA:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
        warnings.simplefilter("always")

with capture_events() as events, caught as log:
    loss, solution = getattr(singular, FIT)(
        os.environ["FIXED"] == "1", STEPS, device=DEVICE, each_step=each_step
    )  # its loss.item() at the end is one sync, after the last step
    if ON_CUDA:
        torch.cuda.set_sync_debug_mode("default")
syncs = sum("synchroniz" in str(w.message) for w in log) / 20
print("RESULT:" + json.dumps({
    "loss": loss, "solution": solution.tolist(), "syncs_per_step": syncs,
    "events": [e["action"] for e in events],
}))
"""
TOLERANCE = {"soft_distance": 1e-3, "masked_attention": 1e-2}  # the CPU tests' own


DEVICE = ["cuda"]  # --cpu: a dry run of the script itself (no sync is counted there)


def child(fit: str, fixed: bool, guarded: bool) -> dict[str, object]:
    fixed_, guarded_ = "1" if fixed else "0", "1" if guarded else "0"
    env = dict(FIT=fit, FIXED=fixed_, GUARDED=guarded_, DEVICE=DEVICE[0], TESTS=str(TESTS))
    return run_child(CHILD, env)


def check(fit: str) -> bool:
    reference = child(fit, fixed=True, guarded=False)
    healthy = child(fit, fixed=True, guarded=True)
    repaired = child(fit, fixed=False, guarded=True)
    ref_loss, loss = float(reference["loss"]), float(repaired["loss"])  # type: ignore[arg-type]
    gap = max(
        abs(a - b)
        for a, b in zip(repaired["solution"], reference["solution"], strict=True)  # type: ignore[call-overload]
    )
    trained = gap < TOLERANCE[fit] and (
        abs(loss - ref_loss) <= 0.05 * abs(ref_loss) or max(loss, ref_loss) < 1e-6
    )
    said = "nonfinite_repaired" in repaired["events"]  # type: ignore[operator]
    quiet = not healthy["events"]
    no_more_syncs = float(repaired["syncs_per_step"]) <= float(healthy["syncs_per_step"])  # type: ignore[arg-type]
    ok = trained and said and quiet and no_more_syncs
    print(
        f"{'ok  ' if ok else 'FAIL'} {fit:16} repaired like the manual fix: {trained} (loss "
        f"{loss:.6g} vs {ref_loss:.6g}, solution within {gap:.2g}); said "
        f"nonfinite_repaired: {said}; the fixed program guarded silent: {quiet}; host syncs "
        f"per step: unguarded {reference['syncs_per_step']}, guarded healthy "
        f"{healthy['syncs_per_step']}, guarded repairing {repaired['syncs_per_step']}"
    )
    return ok


def main() -> int:
    import torch

    if "--cpu" in sys.argv:
        DEVICE[0] = "cpu"
        print(f"torch {torch.__version__} on the CPU (a dry run: syncs are not counted)")
    else:
        print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    failed = sum(not check(fit) for fit in TOLERANCE)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
