"""grad_health's diagnosis, as a newcomer meets it, through the real ``.pth`` of the built
wheel: every statement true, every pointer leading to an event that comes, findings that
fail a strict run, a stall that is never quiet."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from helpers import run_python

SQRT = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
for step in range({steps}):
    optimizer.zero_grad()
    out = model(torch.randn(16, 4))
    target = out.detach() if step in {bad} else torch.zeros_like(out)
    loss = (out - target).pow(2).sum(-1).sqrt().mean()  # SQRT: an exact zero
    loss.backward()
    optimizer.step()
print("finite:", all(bool(p.isfinite().all()) for p in model.parameters()))
"""

DETACHED = """
import torch
backbone, head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD([*backbone.parameters(), *head.parameters()], lr=0.01)
for step in range({steps}):
    optimizer.zero_grad()
    features = backbone(torch.randn(16, 4)).detach()  # the backbone never trains
    head(features).pow(2).mean().backward()
    optimizer.step()
print("done")
"""


def run(python: Path, tmp_path: Path, code: str, mode: str, **env: str):
    log = tmp_path / f"{mode}.jsonl"
    result = run_python(
        python, code, tmp_path, check=False, AUTOGRAD_GUARD=mode, AUTOGRAD_GUARD_LOG=str(log),
        **env,
    )  # fmt: skip
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, [e for e in events if e["action"] != "summary"], events


SKIP = '[guards.grad_health]\nnonfinite_fix = "skip"\n'


def test_sqrt_of_zero_in_fix_names_the_op_and_the_line(guard_python, tmp_path):
    (tmp_path / "autograd_guard.toml").write_text(SKIP)
    result, events, _ = run(guard_python, tmp_path, SQRT.format(steps=8, bad="(3, 4, 5)"), "fix")
    assert result.returncode == 0 and "finite: True" in result.stdout
    first, origin, *rest = events
    assert first["action"] == "nonfinite_gradient" and "skipped" in first["event"]
    assert "nonfinite_origin event follows" in first["remedy"]
    assert origin["op"] == "SqrtBackward0" and origin["forward"] == "<string>:10"  # SQRT
    assert [e["action"] for e in rest] == ["steps_skipped"]
    assert rest[0]["skipped"] == 3 and rest[0]["steps"] == 8


def test_sqrt_of_zero_in_observe_blames_no_op_of_an_already_poisoned_forward(
    guard_python, tmp_path
):
    result, events, _ = run(guard_python, tmp_path, SQRT.format(steps=8, bad="(3,)"), "observe")
    assert "finite: False" in result.stdout  # observe changes nothing
    first, origin = [e for e in events if e["action"] != "nonfinite_loss" and "of" not in e]
    assert "fix would skip it" in first["event"]
    assert "op" not in origin and "already non-finite when they entered" in origin["event"]
    assert "observe let steps with non-finite gradients through" in origin["event"]
    assert "AUTOGRAD_GUARD=fix" in origin["remedy"]


def test_sqrt_of_zero_in_strict_says_what_is_known_and_how_to_get_the_rest(guard_python, tmp_path):
    result, events, _ = run(guard_python, tmp_path, SQRT.format(steps=8, bad="(3, 4)"), "strict")
    assert result.returncode != 0 and "GuardError" in result.stderr
    # step 3 is skipped and said; step 4's backward pass is recorded; step 4 raises (issue 52)
    event, origin = [e for e in events if e["action"] != "nonfinite_loss" and "of" not in e]
    assert event["action"] == "nonfinite_gradient" and "the next step raises" in event["event"]
    assert "stopped on every" not in event["event"]  # one process: no group
    assert "nonfinite_origin" in event["remedy"]  # it follows
    assert origin["op"] == "SqrtBackward0" and origin["forward"].endswith(":10")
    raised = result.stderr.split("GuardError: ", 1)[1]
    assert "made by SqrtBackward0 (the backward of line 10)" in raised
    assert "before the weights changed" in raised


def test_a_one_off_nan_says_its_origin_could_not_be_found_and_what_will(guard_python, tmp_path):
    result, events, _ = run(guard_python, tmp_path, SQRT.format(steps=8, bad="(2,)"), "fix")
    assert result.returncode == 0
    first, origin, skipped = events
    assert first["action"] == "nonfinite_gradient"
    assert "could not be found" in origin["event"] and "one-off" in origin["event"]
    assert "detect_anomaly" in origin["remedy"]
    assert skipped["event"].startswith("1 of 8 optimizer steps of this Adam were skipped")


def test_a_nan_at_the_last_step_still_gets_its_origin_event(guard_python, tmp_path):
    _result, events, _ = run(guard_python, tmp_path, SQRT.format(steps=4, bad="(3,)"), "fix")
    assert [e["action"] for e in events][:2] == ["nonfinite_gradient", "nonfinite_origin"]
    assert "the run ended before another backward pass" in events[1]["event"]


def test_a_detached_backbone_in_a_short_run_is_named_at_exit(guard_python, tmp_path):
    result, events, _ = run(guard_python, tmp_path, DETACHED.format(steps=50), "fix")
    assert result.returncode == 0
    [lost] = events
    assert lost["action"] == "lost_gradient" and "in 50 optimizer steps" in lost["event"]
    assert lost["parameters"] == ["weight", "bias"] and lost["shapes"] == [[8, 4], [8]]


def test_strict_fails_a_short_run_with_a_finding(guard_python, tmp_path):
    result, events, _ = run(guard_python, tmp_path, DETACHED.format(steps=50), "strict")
    assert "done" in result.stdout  # the program ran to its end
    assert result.returncode == 3, result.stderr
    assert "exit status 3" in result.stderr
    assert [e["level"] for e in events] == ["error"]


def test_strict_raises_at_the_step_that_finds_a_lost_gradient(guard_python, tmp_path):
    policy = tmp_path / "autograd_guard.toml"
    policy.write_text("[guards.grad_health]\nlost_steps = 5\n")
    result, _events, _ = run(guard_python, tmp_path, DETACHED.format(steps=50), "strict")
    assert "done" not in result.stdout and "GuardError" in result.stderr
    assert "got no gradient in 5 optimizer steps" in result.stderr


def test_correct_code_is_silent_in_strict(guard_python, tmp_path):
    code = SQRT.format(steps=8, bad="()")
    result, events, everything = run(guard_python, tmp_path, code, "strict")
    assert result.returncode == 0 and events == [] and everything == []


NAN_EVERY_STEP = SQRT.format(steps=90, bad="range(90)")


def test_nan_on_every_step_is_never_quiet(guard_python, tmp_path):
    (tmp_path / "autograd_guard.toml").write_text(SKIP)
    _result, events, everything = run(guard_python, tmp_path, NAN_EVERY_STEP, "fix")
    stalls = [e for e in events if e["action"] == "training_stalled"]
    assert [e["steps"] for e in stalls] == [20, 40, 80]  # again each time it doubles
    assert "20 of 20 steps of this optimizer skipped" in stalls[0]["event"]
    [skipped] = [e for e in events if e["action"] == "steps_skipped"]
    assert skipped["event"].startswith("90 of 90 optimizer steps") and skipped["level"] == "error"
    [summary] = [e for e in everything if e["action"] == "summary"]
    assert any("steps_skipped" in site for site in summary["sites"])


def test_a_repair_that_cannot_lower_the_loss_is_never_quiet(guard_python, tmp_path):
    """The loss is sqrt(0) on every step: repair gives the limit, 0, and the loss cannot
    fall; the repair is said to have stalled, stops, and the skipped steps stall again."""
    _result, events, _ = run(guard_python, tmp_path, NAN_EVERY_STEP, "fix")
    kinds = [e["action"] for e in events]
    assert kinds[:3] == ["nonfinite_gradient", "nonfinite_repaired", "nonfinite_origin"]
    stalls = [e for e in events if e["action"] == "training_stalled"]
    assert "repair stopped" in stalls[0]["event"] and stalls[0]["level"] == "error"
    assert len(stalls) >= 2  # then the skipped steps stall, as without repair
    [repaired] = [e for e in events if e["action"] == "steps_repaired"]
    assert repaired["steps"] == 20


@pytest.mark.parametrize("mode", ["fix", "observe"])
def test_on_stall_raise_stops_the_run(guard_python, tmp_path, mode):
    (tmp_path / "autograd_guard.toml").write_text('[guards.grad_health]\non_stall = "raise"\n')
    result, _events, _ = run(guard_python, tmp_path, NAN_EVERY_STEP, mode)
    assert "GuardError" in result.stderr and "training is not progressing" in result.stderr
    assert result.returncode != 0


TWO_TESTS = """
import torch

def nan_step():
    w = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([w], lr=0.1)
    torch.sqrt((w * 0).pow(2).sum()).backward()
    optimizer.step()

def test_a(autograd_guard_events):
    nan_step()
    assert autograd_guard_events

def test_b(autograd_guard_events):
    nan_step()
    assert autograd_guard_events
"""


def test_the_pytest_plugins_summary_counts_every_test(guard_python, tmp_path):
    (tmp_path / "test_two.py").write_text(TWO_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    code = "import pytest, sys; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider']))"
    result, _, everything = run(guard_python, tmp_path, code, "fix")
    assert result.returncode == 0, result.stdout
    [summary] = [e for e in everything if e["action"] == "summary"]
    assert summary["event"].startswith("summary: 2 interventions at 1 call site")


KEEPS_ITS_OWN = (
    """
import logging, logging.handlers, os
handler = logging.handlers.MemoryHandler(100, target=logging.FileHandler("log.txt"))
logging.getLogger("run").addHandler(handler)
logging.getLogger("run").warning("started")
metrics = open("metrics.csv", "w")  # written, never closed
"""
    + DETACHED.replace('print("done")', 'metrics.write("a,b\\n")\nprint("done")')
    + """
if os.environ.get("FAIL"):
    raise ValueError("the program's own failure")
"""
)


def test_strict_at_exit_flushes_the_programs_logs_and_files(guard_python, tmp_path):
    result, _, _ = run(guard_python, tmp_path, KEEPS_ITS_OWN.format(steps=5), "strict")
    assert result.returncode == 3, result.stderr
    assert (tmp_path / "log.txt").read_text() == "started\n"
    assert (tmp_path / "metrics.csv").read_text() == "a,b\n"


def test_strict_at_exit_leaves_a_failed_programs_own_status(guard_python, tmp_path):
    result = run_python(
        guard_python, KEEPS_ITS_OWN.format(steps=5), tmp_path, check=False,
        AUTOGRAD_GUARD="strict", FAIL="1",
    )  # fmt: skip
    assert result.returncode == 1 and "the program's own failure" in result.stderr
    assert "the run ended with a finding" in result.stderr


def test_an_optimizer_gone_before_exit_is_still_reported(guard_python, tmp_path):
    inside_main = "def main():\n" + textwrap.indent(DETACHED.format(steps=20), "    ")
    code = inside_main + "\nmain()\nimport gc; gc.collect()\n"
    result, events, _ = run(guard_python, tmp_path, code, "fix")
    assert result.returncode == 0 and "done" in result.stdout
    [lost] = events
    assert lost["action"] == "lost_gradient" and "in 20 optimizer steps" in lost["event"]
