"""``pytest --autograd-guard=MODE`` gives the verdict ``AUTOGRAD_GUARD=MODE pytest`` gives,
what the exit would say included: each test is a run of its own, and in strict a lost
gradient in a test shorter than ``lost_steps`` fails that test, named (the variable alone
fails the whole session with status 3 and names no test). A child interpreter each."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TESTS = """
import torch
from torch import nn

def train(steps, detach):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        features = model[:2](torch.randn(8, 4))
        if detach:
            features = features.detach()  # layer 0 never trains
        model[2](features).pow(2).mean().backward()
        optimizer.step()

def test_short_detached():
    train(5, detach=True)

def test_fine():
    train(5, detach=False)
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_short=TESTS)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_strict_fails_the_test_that_lost_a_gradient(pytester: pytest.Pytester):
    result = run(pytester, "--autograd-guard=strict", "-rf")
    assert result.ret == 1
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "autograd-guard strict: a finding at the end of this test*",
            "  [[]grad_health/lost_gradient[]] 2 parameter(s)*",
            "    at *test_short.py:13",
            "FAILED test_short.py::test_short_detached - autograd-guard strict*",
        ]
    )
    assert "strict: the run ended with a finding" not in result.stderr.str()


@pytest.mark.parametrize("mode", ["observe", "fix"])
def test_other_modes_say_it_and_pass(pytester: pytest.Pytester, mode):
    result = run(pytester, f"--autograd-guard={mode}")
    assert result.ret == 0
    result.assert_outcomes(passed=2)
    said = [line for line in result.errlines if "lost_gradient" in line]
    assert len(said) == 1 and "test_short.py:13" in said[0], result.errlines


def test_the_variable_alone_fails_the_session(pytester: pytest.Pytester, monkeypatch):
    monkeypatch.setenv("AUTOGRAD_GUARD", "strict")
    result = run(pytester)
    assert result.ret == 3
    result.assert_outcomes(passed=2)
    assert any("lost_gradient" in line for line in result.errlines)


NAN_AT_THE_END = """
import torch

def test_nan_at_the_last_step():
    w = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([w], lr=0.1)
    for step in range(3):
        optimizer.zero_grad()
        torch.sqrt((w * (0.0 if step == 2 else 1.0)).pow(2).sum()).backward()
        optimizer.step()
    assert bool(w.isfinite().all())
"""


def test_strict_fails_a_test_whose_last_step_was_not_finite(pytester: pytest.Pytester):
    """strict skips the first non-finite step to name its op and raises at the next step;
    a test with no step after it still fails, at its end (issue 52)."""
    pytester.makepyfile(test_end=NAN_AT_THE_END)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--autograd-guard=strict")
    assert result.ret == 1
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]grad_health/nonfinite_gradient[]]*the run ended before*"])
