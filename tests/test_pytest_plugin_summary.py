"""The exit summary of a session guarded by ``pytest --autograd-guard=MODE`` counts every
intervention of every test: two tests that each meet the same risky call once make two
interventions at one call site (events are logged once per call site; the count is not)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

STAGE = """
import torch

def reconstruct_stage1(x):
    w = torch.zeros(1, requires_grad=True)
    ((w - x) ** 2).sum().backward()
    return w.grad
"""

POLICY = """
[[rules]]
target = "mesh_reconstruction.recon:reconstruct_stage1"
action = "enable_grad"
"""

TWO_TESTS = """
import torch
from mesh_reconstruction.recon import reconstruct_stage1

def call():
    with torch.no_grad():
        return reconstruct_stage1(torch.ones(1))

def test_a():
    assert call() is not None

def test_b(autograd_guard_events):
    assert call() is not None
    assert [e["action"] for e in autograd_guard_events] == ["enable_grad"]
"""


@pytest.mark.parametrize("mode", ["fix", "strict"])
def test_two_tests_with_one_intervention_each_count_two(pytester: pytest.Pytester, mode):
    (pytester.mkpydir("mesh_reconstruction") / "recon.py").write_text(STAGE)
    pytester.makepyfile(test_two=TWO_TESTS)
    pytester.makefile(".toml", autograd_guard=POLICY)
    pytester.syspathinsert()
    result = pytester.runpytest_subprocess(f"--autograd-guard={mode}", "-p", "no:cacheprovider")
    assert result.ret == (0 if mode == "fix" else 1)
    if mode == "strict":
        result.assert_outcomes(failed=2)
    summary = [line for line in result.errlines if "summary:" in line]
    assert summary == [
        "autograd-guard info: [autograd_guard/summary] summary: 2 interventions at 1 call site"
    ]
