"""grad_audit's false-alarm rate, measured: every case of the clean corpus
(``tests/grad_audit_corpus.py``: correct Functions, smooth and not, float32-only, random,
an injector, an ODE-adjoint closure read, checkpointing) run from many random seeds, each
trial with the guard installed afresh (so each is a Function's first call, audited), and
the findings counted; the bug cases likewise, for the detection rate. Also counted: the
trials whose audit judged at least one input (not skipped), so that a silent case is seen
to have been audited.

    python scripts/grad_audit_false_alarms.py [--trials 200]

With ``--pot``, POT's losses instead (``tests/grad_audit_pot.py``: injected gradients,
judged through their library call), with POT importable (its folder on ``PYTHONPATH``:
``python scripts/thirdparty.py pot-0.9.4`` installs one); the KL fit counts as correct
from POT 0.9.4 on and as the bug below it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import grad_audit_corpus as corpus
import torch

import autograd_guard
from autograd_guard._events.actions import FINDINGS
from autograd_guard.guards.grad_audit import audit as _audit
from autograd_guard.guards.grad_audit import injected as _injected
from autograd_guard.testing import capture_events

JUDGED: list[object] = []
LOG = os.path.join(tempfile.mkdtemp(), "events.jsonl")  # the events, out of the table's way


def _counting_judge(cls: type) -> None:
    original = cls.judge  # type: ignore[attr-defined]

    def judge(self, grad_inputs, grad_outputs):  # type: ignore[no-untyped-def]
        JUDGED.append(original(self, grad_inputs, grad_outputs))
        return JUDGED[-1]

    cls.judge = judge  # type: ignore[attr-defined]


def _cases(pot: bool) -> tuple[dict, dict]:
    """(correct cases, bug cases: name -> case)."""
    if not pot:
        return corpus.CLEAN, {name: case for name, (case, _) in corpus.BUGS.items()}
    import grad_audit_pot
    import ot
    from packaging.version import Version

    fixed = Version(ot.__version__) >= Version("0.9.4")
    clean = {**grad_audit_pot.CLEAN, **(grad_audit_pot.FIXED_ONLY if fixed else {})}
    if not fixed:
        clean = {k: v for k, v in clean.items() if k not in grad_audit_pot.SINCE_0_9_4}
    print(f"POT {ot.__version__}\n")
    return clean, ({} if fixed else grad_audit_pot.BUGS)


def trial(case, seed: int) -> tuple[int, bool]:
    """(findings, whether an audit judged an input) of one run of ``case``."""
    JUDGED.clear()
    autograd_guard.install({"mode": "observe", "log": LOG})
    try:
        with capture_events() as events:
            torch.manual_seed(seed)
            case(seed)
    finally:
        autograd_guard.uninstall()
    judged = any(not isinstance(j, str) and j for j in JUDGED)
    return sum(e["action"] in FINDINGS for e in events), judged


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--pot", action="store_true", help="POT's losses (see above)")
    options = parser.parse_args()
    trials = options.trials
    torch.set_num_threads(1)
    _counting_judge(_audit.Audit)
    _counting_judge(_injected.Injected)
    clean, bugs_cases = _cases(options.pot)
    alarms = total = 0
    print("| case | trials | audited | findings |\n|---|---|---|---|")
    for name, case in clean.items():
        runs = [trial(case, 1000 + seed) for seed in range(trials)]
        found = sum(1 for f, _ in runs if f)
        alarms, total = alarms + found, total + trials
        print(f"| {name} | {trials} | {sum(j for _, j in runs)} | {found} |")
    caught = bugs = 0
    for name, case in bugs_cases.items():
        found = sum(1 for seed in range(trials) if trial(case, 1000 + seed)[0])
        caught, bugs = caught + found, bugs + trials
        print(f"| {name} (bug) | {trials} | - | {found} |")
    print(f"\nfalse alarms: {alarms} in {total} trials of correct code ({alarms / total:.4%})")
    if bugs:
        print(f"bugs caught: {caught} in {bugs} trials ({caught / bugs:.2%})")


if __name__ == "__main__":
    main()
