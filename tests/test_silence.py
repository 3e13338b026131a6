"""Correct code produces no event, in fix and in strict, for the guards whose libraries run
in this process (gsplat, ipex_xpu and warp_torch_args prove it in their own test files)."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_attached

import autograd_guard
from autograd_guard.testing import capture_events

CODE = """
import torch

def stage(x):
    w = torch.ones_like(x, requires_grad=True)
    (w * x).sum().backward()
    return w.grad

def reads(x, y):
    return x + y

def fills(x, out):
    out.copy_(x * 2)
    return out
"""


@pytest.fixture(params=["fix", "strict"])
def guarded(request, make_module):
    make_module("correct_code", CODE)
    autograd_guard.install(
        {
            "mode": request.param,
            "rules": [
                {"target": "correct_code:stage", "action": "enable_grad"},
                {"target": "correct_code:reads", "action": "snapshot", "check": "data"},
                {"target": "correct_code:fills", "action": "snapshot", "outputs": ["out"]},
            ],
        }
    )
    import correct_code

    return correct_code


def test_grad_mode_stage_called_with_grad_on(guarded):
    assert_attached("grad_mode", "correct_code:stage")
    with capture_events() as events:
        assert guarded.stage(torch.ones(3)).tolist() == [1.0, 1.0, 1.0]
    assert events == []


def test_snapshot_rules_on_functions_that_write_only_what_they_declare(guarded):
    assert_attached("snapshot_inputs", "correct_code:reads", "correct_code:fills")
    x, out = torch.ones(3), torch.zeros(3)
    with capture_events() as events:
        guarded.reads(x, x)
        guarded.fills(x, out)
        guarded.fills(x, out=out)
    assert out.tolist() == [2.0, 2.0, 2.0] and events == []
