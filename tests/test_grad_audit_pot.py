"""grad_audit against a real library's injected gradients: POT (Python Optimal Transport)
computes each loss and its gradient itself and hands both to torch through an injector
Function, which cannot be judged by itself. Its library call is re-called instead.

POT#610: ``gromov_wasserstein2(..., loss_fun="kl_loss")`` injects a gradient for ``C2``
with one term of the wrong sign on 0.8.0 to 0.9.3, fixed in 0.9.4. Unguarded, a fit of
``C2`` by it walks away from the optimum; guarded, it is named at its first call in every
mode and the gradient is left as it is. On 0.9.4 and the newest release the same fit and
a corpus of POT's losses (exact transport by points and by weights, float32, entropic
transport by the envelope theorem converged and stopped early, Gromov-Wasserstein,
fused Gromov-Wasserstein) are judged and silent, bit-identical to unguarded. In child
interpreters, one POT per process (its folder first on the path).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import thirdparty
from packaging.version import Version as _Version

pytestmark = [
    *globals().get("pytestmark", []),
    pytest.mark.skipif(
        _Version(__import__("torch").__version__.split("+")[0]) < _Version("2.2"),
        reason="grad_audit stands down on torch < 2.2",
    ),
    pytest.mark.skipif(
        sys.version_info >= (3, 13), reason="POT 0.9.3 and 0.9.4 have no cp313 wheel"
    ),
]

SCRIPT = """
import json, os, warnings
import autograd_guard
from autograd_guard.guards.grad_audit import injected
from autograd_guard.testing import capture_events

policy = json.loads(os.environ["TEST_POLICY"])
if policy is not None:
    autograd_guard.install(policy)
import ot
import grad_audit_pot as cases

judged, judge = [], injected.Injected.judge
def recorded(self, *args):
    judged.append(judge(self, *args))
    return judged[-1]
injected.Injected.judge = recorded

result = {"version": ot.__version__, "clean": sorted(cases.CLEAN)}
with capture_events() as events:
    for name in os.environ["TEST_CASES"].split():
        try:
            result[name] = getattr(cases, name)(int(os.environ["TEST_SEED"]))
        except autograd_guard.GuardError as error:
            result[name] = f"GuardError: {error}"
result["events"] = [
    {k: e.get(k) for k in ("action", "function", "callsite", "event")}
    for e in events if e["action"] != "summary"
]
guard = autograd_guard.status()["guards"].get("grad_audit", {})
result["skipped"] = guard.get("notes", {}).get("audits_skipped", {})
result["judged"] = [v if isinstance(v, str) else [[p, n.wrong(k)] for p, n, k in v] for v in judged]
print(json.dumps(result))
"""
# Solver calls of about 100 ms on a loaded machine would be skipped (max_forward_ms).
OPTIONS = {"guards": {"grad_audit": {"max_forward_ms": 10000}}}
SEED = 1002  # a seed whose first call POT 0.9.3's solver answers within 100 ms here
CASES_FILE = str(Path(__file__).parent / "grad_audit_pot.py")


def run(version, mode, cases, tmp_path, seed=SEED):
    folder = thirdparty.install(version)
    policy = None if mode is None else {"mode": mode, **OPTIONS}
    tests = str(Path(CASES_FILE).parent)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        cwd=tmp_path,  # the library's folder is not the program's own
        env={
            "PYTHONPATH": thirdparty.first_on_path(f"{folder}:{tests}"),
            "TEST_POLICY": json.dumps(policy),
            "TEST_CASES": " ".join(cases),
            "TEST_SEED": str(seed),
            "OMP_NUM_THREADS": "1",
        },
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_pot_0_9_3_s_wrong_kl_gradient_is_named_at_its_first_call_in_every_mode(tmp_path):
    bare = run("pot-0.9.3", None, ["gw_kl_train"], tmp_path)
    fixed = run("pot-0.9.4", None, ["gw_kl_train"], tmp_path)
    assert bare["version"] == "0.9.3" and fixed["version"] == "0.9.4"
    (losses, _), (fixed_losses, _) = bare["gw_kl_train"], fixed["gw_kl_train"]
    # the symptom: the wrong gradient walks away, the fixed release fits
    assert losses[-1] > 3 * fixed_losses[-1] and fixed_losses[-1] < fixed_losses[0]
    for mode in ("observe", "fix"):
        guarded = run("pot-0.9.3", mode, ["gw_kl_train"], tmp_path)
        assert guarded["gw_kl_train"] == bare["gw_kl_train"], mode  # never changed
        [event] = guarded["events"]
        assert event["action"] == "wrong_gradient", event
        assert event["function"] == "ot.gromov._gw.gromov_wasserstein2", event
        assert event["callsite"].startswith(CASES_FILE), event  # the user's line
        assert "argument C2" in event["event"] and "through ot.backend" in event["event"]
        assert guarded["judged"][0] == [["C2", True]], guarded["judged"]  # its first call
    strict = run("pot-0.9.3", "strict", ["gw_kl_train"], tmp_path)
    assert strict["gw_kl_train"].startswith("GuardError"), strict["gw_kl_train"]
    assert "gromov_wasserstein2 injects a gradient" in strict["gw_kl_train"]


CLEAN = [  # grad_audit_pot.CLEAN (checked below)
    "emd2_float32",
    "emd2_marginals",
    "emd2_points",
    "fused_gw",
    "gw_float32_points",
    "gw_square_fit",
    "sinkhorn_envelope",
    "sinkhorn_envelope_early",
]
CASES = [*CLEAN, "gw_kl_fit"]


@pytest.mark.parametrize("version", ["pot-0.9.4", "pot-0.9.7"])
def test_pot_s_correct_losses_are_judged_silent_and_bit_identical(version, tmp_path):
    bare = run(version, None, CASES, tmp_path)
    assert run(version, "observe", ["gw_float32_points"], tmp_path, seed=27)["events"] == []
    assert bare["clean"] == CLEAN
    for name in CASES:  # one process each: an injector's first calls are judged
        guarded = run(version, "observe", [name], tmp_path)
        assert guarded["events"] == [] and guarded[name] == bare[name], name
        assert guarded["judged"] and guarded["skipped"] == {}, (name, guarded)
        for verdicts in guarded["judged"]:
            assert verdicts and not isinstance(verdicts, str), (name, verdicts)
            assert not any(wrong for _, wrong in verdicts), (name, verdicts)
    for mode in ("fix", "strict"):
        guarded = run(version, mode, CASES, tmp_path)
        assert guarded["events"] == [], mode
        assert all(guarded[name] == bare[name] for name in CASES), mode
