"""A ``log`` path in a policy is relative to the policy file's folder, as ruff's paths are
relative to its configuration; ``AUTOGRAD_GUARD_LOG``'s is the working directory's. Run from
another folder, in a child interpreter through the built wheel's ``.pth``."""

from __future__ import annotations

import json

from helpers import run_python

LOOP = """
import torch
w = torch.nn.Parameter(torch.ones(2))
optimizer = torch.optim.SGD([w], lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    (w * (float("nan") if step == 1 else 1.0)).sum().backward()
    optimizer.step()
"""


def test_a_policys_log_path_is_relative_to_the_policy_file(guard_python, tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "logs").mkdir(parents=True)
    elsewhere.mkdir()
    policy = project / "autograd_guard.toml"
    policy.write_text('log = "logs/events.jsonl"\n')
    result = run_python(
        guard_python, LOOP, elsewhere, AUTOGRAD_GUARD="1", AUTOGRAD_GUARD_POLICY=str(policy)
    )
    assert "nonfinite_gradient" not in result.stderr  # they went to the file
    events = [
        json.loads(line) for line in (project / "logs" / "events.jsonl").read_text().splitlines()
    ]
    assert "nonfinite_gradient" in [e["action"] for e in events]
    assert not (elsewhere / "logs").exists()


def test_the_variables_log_path_is_relative_to_the_working_directory(guard_python, tmp_path):
    (tmp_path / "logs").mkdir()
    run_python(guard_python, LOOP, tmp_path, AUTOGRAD_GUARD="1", AUTOGRAD_GUARD_LOG="logs/e.jsonl")
    assert "nonfinite_gradient" in (tmp_path / "logs" / "e.jsonl").read_text()
