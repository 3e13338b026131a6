"""The guard is invisible except for its remedy: the wrapped body runs once, the user's
exceptions come back as the same objects with the same context, wrappers pickle and copy
like the originals, and targets that are not functions are left alone."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import autograd_guard
from autograd_guard.testing import capture_events

STAGES = '''
calls = {"n": 0}

class StageError(ValueError):
    pass

def failing_stage(x):
    calls["n"] += 1
    try:
        raise KeyError("inner")
    except KeyError as inner:
        raise StageError("user data 12345") from inner

def recursive_stage(depth):
    calls["n"] += 1
    if depth == 0:
        raise StageError("bottom")
    return recursive_stage(depth - 1)

def plain(x):
    return x + 1
'''


@pytest.fixture
def stages(make_module):
    make_module("user_stages", STAGES)
    import user_stages

    return user_stages


def _rules(*names: str, action: str = "enable_grad") -> dict[str, object]:
    return {"rules": [{"target": f"user_stages:{n}", "action": action} for n in names]}


@pytest.mark.parametrize("mode", ["observe", "fix", "strict"])
def test_a_user_exception_on_the_pass_through_path_runs_the_body_once(stages, mode):
    autograd_guard.install({"mode": mode, **_rules("failing_stage")})
    import user_stages

    with capture_events() as events, pytest.raises(user_stages.StageError) as raised:
        user_stages.failing_stage(1)  # grad is on: not risky
    assert user_stages.calls["n"] == 1
    error = raised.value
    assert isinstance(error.__cause__, KeyError) and error.__context__ is error.__cause__
    assert events == []


def test_a_recursive_stage_raising_deep_down_runs_each_level_once(stages):
    autograd_guard.install({"mode": "strict", **_rules("recursive_stage")})
    import user_stages

    with capture_events() as events, pytest.raises(user_stages.StageError) as raised:
        user_stages.recursive_stage(15)
    assert user_stages.calls["n"] == 16
    assert raised.value.__context__ is None
    assert events == []


def test_the_library_error_on_the_risky_path_is_the_same_object(stages):
    autograd_guard.install(_rules("failing_stage"))
    import user_stages

    with torch.no_grad(), pytest.raises(user_stages.StageError) as raised:
        user_stages.failing_stage(1)  # risky: the guard re-enables grad, the body raises
    assert user_stages.calls["n"] == 1
    assert isinstance(raised.value.__cause__, KeyError)
