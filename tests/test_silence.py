"""Correct code produces no event and no warning, in fix and in strict, for the guards whose
libraries run in this process (gsplat, ipex_xpu and warp_torch_args prove it in their own
test files; the twin corpus compares every warning of whole programs)."""

from __future__ import annotations

import contextlib
import warnings

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


@contextlib.contextmanager
def silent():
    """Nothing logged, and no warning issued (each one, as under ``-W always``)."""
    with capture_events() as events, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    assert events == []
    assert [f"{w.filename}:{w.lineno}: {w.message}" for w in caught] == []


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
    with silent():
        assert guarded.stage(torch.ones(3)).tolist() == [1.0, 1.0, 1.0]


def test_snapshot_rules_on_functions_that_write_only_what_they_declare(guarded):
    assert_attached("snapshot_inputs", "correct_code:reads", "correct_code:fills")
    x, out = torch.ones(3), torch.zeros(3)
    with silent():
        guarded.reads(x, x)
        guarded.fills(x, out)
        guarded.fills(x, out=out)
    assert out.tolist() == [2.0, 2.0, 2.0]


def test_grad_health_on_a_correct_training_loop_with_a_scheduler(guarded):
    # torch's scheduler warns when optimizer.step() seems not to have run before it: the
    # gate in the step wrapper must leave what the scheduler reads as it was.
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    with silent():
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.ones(2, 3)).sum().backward()
            optimizer.step()
            scheduler.step()
    assert optimizer.state_dict()["state"][0]["step"].item() == 3
