"""Snapshot rules: a user function that writes into its inputs, caught by version
counters (torch ops) or by data copies (raw writes through .numpy())."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_attached

import autograd_guard
from autograd_guard.testing import capture_events

USER_OPS = """
def scale(x, factor):
    x.mul_(factor)            # in place through a torch op: bumps x._version
    return x * 1

def raw(x, y):
    x.numpy()[0] += 5.0       # through a raw pointer: the version counter never moves
    return x + y

def fill(x, out):
    out.copy_(x)              # writes its output argument, on purpose
    return out
"""


@pytest.fixture
def ops(make_module):
    make_module("user_ops", USER_OPS)
    import user_ops

    return user_ops


def rule(target, mode="fix", **options):
    return {
        "mode": mode,
        "rules": [{"target": f"user_ops:{target}", "action": "snapshot", **options}],
    }


def test_version_check_catches_a_torch_inplace_op(ops):
    autograd_guard.install(rule("scale", mode="observe"))
    x = torch.ones(3)
    with capture_events() as events:
        ops.scale(x, 2.0)
    [event] = events
    assert event["action"] == "input_modified" and event["restored"] is False
    assert 'set check = "data" on this rule to restore' in event["event"]
    assert event["changes"] == [
        {"argument": "x", "shape": [3], "dtype": "torch.float32", "max_abs_change": None}
    ]
    assert torch.equal(x, torch.full((3,), 2.0))  # observe changes nothing


def test_version_check_in_fix_switches_to_data_and_restores(ops):
    autograd_guard.install(rule("scale"))
    x = torch.ones(3)
    ops.scale(x, 2.0)  # seen, logged; this call could not be undone
    y = torch.ones(3)
    with capture_events() as events:
        out = ops.scale(y, 2.0)
    assert torch.equal(y, torch.ones(3))  # restored
    assert torch.equal(out, torch.full((3,), 2.0))  # the function's result is unchanged
    assert events[0]["restored"] is True and events[0]["changes"][0]["max_abs_change"] == 1.0


def test_raw_write_is_only_seen_by_a_data_check(ops):
    autograd_guard.install(rule("raw"))
    assert_attached("snapshot_inputs", "user_ops:raw")
    x = torch.arange(4.0)
    with capture_events() as events:
        ops.raw(x, torch.ones(4))
    assert events == [] and x[0].item() == 5.0  # version: blind to raw writes
    autograd_guard.install(rule("raw", check="data"))
    x = torch.tensor([0.1, float("nan"), -0.0, 3.0])
    original = x.clone()
    with capture_events() as events:
        ops.raw(x, torch.ones(4))
    assert x.numpy().tobytes() == original.numpy().tobytes()  # the exact bytes are back
    assert events[0]["changes"] == [
        {
            "argument": "x",
            "shape": [4],
            "dtype": "torch.float32",
            "max_abs_change": pytest.approx(5.0),
        }
    ]


def test_strict_raises_naming_the_argument(ops):
    autograd_guard.install(rule("raw", mode="strict", check="data"))
    x = torch.zeros(2)
    with pytest.raises(autograd_guard.GuardError, match=r"\['x'\]"):
        ops.raw(x, torch.zeros(2))
    assert torch.equal(x, torch.zeros(2))


def test_byte_limit_falls_back_to_version_and_says_so_once(ops):
    autograd_guard.install(rule("raw", check="data", max_bytes=8))
    with capture_events() as events:
        for _ in range(3):
            ops.raw(torch.zeros(4), torch.zeros(4))  # 32 bytes: over the limit
    [limit] = [e for e in events if e["action"] == "over_byte_limit"]
    assert "max_bytes = 8" in limit["event"]
    assert not [e for e in events if e["action"] == "input_modified"]  # raw write unseen
    small = torch.zeros(1)
    ops.raw(small, torch.zeros(1))  # 8 bytes: copied, restored
    assert small.item() == 0.0


@pytest.mark.parametrize("outputs", [["out"], [1]])
def test_declared_outputs_are_exempt(ops, outputs):
    autograd_guard.install(rule("fill", check="data", outputs=outputs))
    assert_attached("snapshot_inputs", "user_ops:fill")
    out = torch.zeros(2)
    with capture_events() as events:
        ops.fill(torch.ones(2), out=out) if outputs == ["out"] else ops.fill(torch.ones(2), out)
    assert events == [] and torch.equal(out, torch.ones(2))


def test_policy_validates_rule_options(tmp_path):
    from autograd_guard import PolicyError

    with pytest.raises(PolicyError, match=r"rules\[0\].check.*'version', 'data'"):
        autograd_guard.install(rule("raw", check="bytes"))
    with pytest.raises(PolicyError, match=r"rules\[0\].outputs.*names or positions"):
        autograd_guard.install(rule("raw", outputs=[True]))


def test_a_restore_leaves_the_callers_graph_usable(ops):
    # Issue 19 item 2: a copy_() restore moved the version counter, and a graph that had
    # saved the input failed in backward ("modified by an inplace operation").
    autograd_guard.install(rule("raw", check="data"))
    weight = torch.ones(3, requires_grad=True)
    x = torch.tensor([1.0, 2.0, 3.0])
    energy = (weight * x).sum()  # saves x
    version = x._version
    with capture_events() as events:
        ops.raw(x, torch.zeros(3))
    assert x.tolist() == [1.0, 2.0, 3.0] and x._version == version
    energy.backward()
    assert weight.grad.tolist() == [1.0, 2.0, 3.0]  # as if the call had been given a clone
    assert [e["restored"] for e in events] == [True]


def test_a_restore_says_when_the_write_moved_the_version_counter(ops):
    autograd_guard.install(rule("scale", check="data"))
    x = torch.ones(3)
    with capture_events() as events:
        ops.scale(x, 2.0)
    [event] = events
    assert x.tolist() == [1.0, 1.0, 1.0]
    assert "graphs that saved them before the call still cannot run backward" in event["event"]
    assert event["changes"][0]["version_moved"] is True
