"""A policy is data: it never imports or runs anything, and logs never hold tensor values."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from helpers import run_python

import autograd_guard
from autograd_guard._policy import policy as _policy
from autograd_guard.errors import PolicyError
from autograd_guard.guards import available

TRIPWIRE = "import pathlib\npathlib.Path('IMPORTED').write_text('x')\ndef f(x):\n    return x\n"


def test_named_modules_are_never_imported(tmp_path):
    (tmp_path / "tripwire.py").write_text(TRIPWIRE)
    (tmp_path / "autograd_guard.toml").write_text("""
[guards.ipex_xpu]
crosscheck = ["tripwire:Model"]
[[rules]]
target = "tripwire:f"
action = "enable_grad"
[[rules]]
target = "tripwire:f"
action = "snapshot"
""")
    run_python(
        sys.executable,
        "import autograd_guard; assert autograd_guard.status()['installed']",
        tmp_path,
        AUTOGRAD_GUARD="1",
        PYTHONPATH=str(tmp_path),
    )
    assert not (tmp_path / "IMPORTED").exists()


def test_a_policy_cannot_run_code(tmp_path):
    evil = tmp_path / "evil.py"
    evil.write_text("import pathlib\npathlib.Path('RAN').write_text('x')\n")
    attempts = [
        f'extends = "{evil}"',
        "[[rules]]\ntarget = \"__import__('os').system('touch RAN')\"\naction = \"enable_grad\"",
        'log = "$(touch RAN)"\nmode = "observe"',
        'mode = "`touch RAN`"',
    ]
    for text in attempts:
        (tmp_path / "autograd_guard.toml").write_text(text + "\n")
        run_python(
            sys.executable, "import torch", tmp_path, AUTOGRAD_GUARD="1", PYTHONPATH=str(tmp_path)
        )
    assert not (tmp_path / "RAN").exists()
    assert (tmp_path / "$(touch RAN)").exists() is False  # no event was logged to it either


def test_logs_never_hold_tensor_values(make_module, tmp_path, capsys):
    make_module("leaky_ops", "def scribble(x):\n    x.numpy()[:] = 98765.4321\n    return x\n")
    import leaky_ops

    log = tmp_path / "events.jsonl"
    for destination in (str(log), "stderr"):
        autograd_guard.install(
            {
                "log": destination,
                "mode": "observe",
                "rules": [{"target": "leaky_ops:scribble", "action": "snapshot", "check": "data"}],
            }
        )
        leaky_ops.scribble(torch.full((3,), 12345.678))
    with pytest.raises(autograd_guard.GuardError) as info:
        autograd_guard.install(
            {
                "mode": "strict",
                "rules": [{"target": "leaky_ops:scribble", "action": "snapshot", "check": "data"}],
            }
        )
        leaky_ops.scribble(torch.full((3,), 12345.678))
    written = log.read_text() + capsys.readouterr().err + str(info.value)
    assert "input_modified" in written and "scribble" in written
    for value in ("12345", "98765"):
        assert value not in written
    records = [json.loads(line) for line in log.read_text().splitlines()]
    [record] = [r for r in records if r["action"] == "input_modified"]
    assert record["changes"][0]["shape"] == [3]


def test_unreadable_policy_gives_a_clear_error(tmp_path):
    folder = tmp_path / "policy.toml"
    folder.mkdir()
    with pytest.raises(PolicyError) as info:
        _policy.load(str(folder), available(), environ={})
    assert str(info.value) == f"{folder}: not a regular file (allowed: a TOML file)"
    if os.geteuid() != 0:  # root reads any file
        locked = tmp_path / "locked.toml"
        locked.write_text('mode = "fix"\n')
        locked.chmod(0)
        with pytest.raises(PolicyError, match="cannot read the policy file"):
            _policy.load(str(locked), available(), environ={})
