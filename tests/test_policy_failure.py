"""A policy the auto-load can partly use: what it can read applies and each problem is
a warning (one headline, one line each, said again at exit); an unreadable file gives
way to the default preset; where strict was asked for (in so many words or by a near
miss) a problem stops the program at its import of torch. The same through the wheel's
``.pth`` in child interpreters: tests/test_policy_autoload.py."""

from __future__ import annotations

import sys

import pytest
import torch  # noqa: F401 - imported already, as in a program that stops at once

from autograd_guard._common import STATE
from autograd_guard._engine import engine as _engine
from autograd_guard._policy import failure as _policy_failure

PROBLEMS = 'mode = "loud"\nspeed = 3\n[guards.grad_mode]\nmod = "fix"\n'


class Stopped(Exception):
    """What the test's stand-in for ``os._exit`` raises."""


@pytest.fixture
def stops(monkeypatch):
    """``os._exit`` replaced: the statuses the failure handler asked for."""
    statuses: list[int] = []

    def exit_(status: int) -> None:
        statuses.append(status)
        raise Stopped

    monkeypatch.setattr(_policy_failure.os, "_exit", exit_)
    yield statuses
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_StopAtTorch"]


@pytest.mark.parametrize(
    ("environ", "policy", "asked"),
    [
        ({"AUTOGRAD_GUARD": "strict"}, None, "AUTOGRAD_GUARD=strict"),
        ({"AUTOGRAD_GUARD": "stirct"}, None, "AUTOGRAD_GUARD=stirct"),
        ({"AUTOGRAD_GUARD": "STRICT"}, None, "AUTOGRAD_GUARD=STRICT"),
        ({"AUTOGRAD_GUARD": "fix"}, 'mode = "strict"\n', ""),  # the variable overrides
        ({"AUTOGRAD_GUARD": "fx"}, 'mode = "strict"\n', ""),  # a near miss of fix, too
        ({"AUTOGRAD_GUARD": "1"}, 'mode = "strcit"\n', "mode = 'strcit' in "),
        ({"AUTOGRAD_GUARD": "1"}, 'mode = "Strict"\n', "mode = 'Strict' in "),
        ({"AUTOGRAD_GUARD": "1"}, 'mode = "fix"\n', ""),
        ({"AUTOGRAD_GUARD": "1"}, "[guards.grad_mode]\nmode = 'strict'\n", "guards.grad_mode"),
        ({"AUTOGRAD_GUARD": "1"}, 'extends = "strict"\n', "mode = 'strict' in preset strict"),
        ({"AUTOGRAD_GUARD": "1"}, 'extends = "strcit"\n', "extends = 'strcit' in "),
        ({"AUTOGRAD_GUARD": "1"}, 'extends = "strict"\nmode = "fix"\n', ""),
        ({"AUTOGRAD_GUARD": "1"}, 'mode = "strict"\nx = [\n', "on line 1 of"),  # not TOML
        ({"AUTOGRAD_GUARD": "1"}, 'mode = "fix"\nx = [\n', ""),
        ({"AUTOGRAD_GUARD": "yes", "AUTOGRAD_GUARD_POLICY": "strict"}, None, "preset strict"),
        ({"AUTOGRAD_GUARD": "1", "AUTOGRAD_GUARD_POLICY": "stirct"}, None, "POLICY=stirct"),
        ({"AUTOGRAD_GUARD": "1", "AUTOGRAD_GUARD_POLICY": "observe"}, None, ""),
        ({"AUTOGRAD_GUARD": "1"}, None, ""),  # the default preset
    ],
)
def test_where_strict_was_asked_for(tmp_path, environ, policy, asked):
    if policy is not None:
        (tmp_path / "autograd_guard.toml").write_text(policy)
    found = _policy_failure.strict_requested(environ, str(tmp_path))
    assert (asked in found) if asked else found == ""


def test_a_pyproject_that_does_not_parse_is_read_in_its_own_table_only(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.other]\nmode = "strict"\n[tool.autograd_guard]\nmode = "fix"\nx=\n')
    assert _policy_failure.strict_requested({"AUTOGRAD_GUARD": "1"}, str(tmp_path)) == ""
    pyproject.write_text('[tool.autograd_guard]\nmode = "strict"  # CI\nx=\n')
    found = _policy_failure.strict_requested({"AUTOGRAD_GUARD": "1"}, str(tmp_path))
    assert found.startswith("mode = 'strict' on line 2 of ")


def test_partly_used_one_headline_and_one_line_per_problem(tmp_path, capsys, stops):
    (tmp_path / "autograd_guard.toml").write_text(PROBLEMS + "enabled = false\n")
    _engine.install_from_environment({"AUTOGRAD_GUARD": "1"})
    lines = _said(capsys.readouterr().err)
    assert lines[0] == (
        "autograd-guard: invalid policy: 3 settings ignored, the rest applies and the guard "
        "is on ('autograd-guard check' lists them):"
    )
    path = tmp_path / "autograd_guard.toml"
    assert lines[1:] == [
        f"autograd-guard: {path}: speed: unknown key (allowed: extends, mode, log, disable, "
        "guards, rules)",
        f"autograd-guard: {path}: mode: invalid value 'loud' (allowed: 'off', 'observe', "
        "'fix', 'strict')",
        f"autograd-guard: {path}: guards.grad_mode.mod: unknown key; did you mean 'mode'? "
        "(allowed: enabled, mode, force)",
    ]
    # what could be read applies: grad_mode's table is read (enabled = false), its typo
    # ignored; the other guards run in the default mode
    assert stops == [] and STATE.error is None and STATE.policy.mode == "fix"
    assert STATE.policy.mode_for("grad_mode") == "off" and len(STATE.policy.warnings) == 3
    assert STATE.policy.mode_for("grad_health") == "fix"


def test_the_warnings_are_said_again_at_exit(tmp_path, capsys, stops):
    (tmp_path / "autograd_guard.toml").write_text('mdoe = "fix"\n')
    _engine.install_from_environment(
        {"AUTOGRAD_GUARD": "1", "AUTOGRAD_GUARD_DISABLE": "grad_helth"}
    )
    start = _said(capsys.readouterr().err)
    (again,) = [c for c in STATE.exit_checks if c.__qualname__.endswith("again")]
    STATE.exit_checks.remove(again)
    again()
    end = capsys.readouterr().err.splitlines()
    assert end == ["autograd-guard: said at start:", *(f"  {line}" for line in start)]
    assert "'grad_helth', ignored; did you mean 'grad_health'?" in start[-1]
    assert STATE.policy.mode_for("grad_health") == "fix"  # a typo leaves the guard on


def test_one_problem_in_the_singular(tmp_path, capsys, stops):
    (tmp_path / "autograd_guard.toml").write_text('mode = "loud"\n')
    _engine.install_from_environment({"AUTOGRAD_GUARD": "1"})
    assert ": 1 setting ignored, " in capsys.readouterr().err.splitlines()[0]


@pytest.mark.parametrize("value", ["fxi", "ture", "obsreve", "banana"])
def test_a_mistyped_variable_runs_in_the_policys_modes(tmp_path, capsys, stops, value):
    (tmp_path / "autograd_guard.toml").write_text('mode = "observe"\n')
    _engine.install_from_environment({"AUTOGRAD_GUARD": value})
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("autograd-guard: invalid AUTOGRAD_GUARD value: 1 setting ")
    assert f"invalid value {value!r}, ignored: the guard is on in the policy's modes " in lines[1]
    assert "(mode observe)" in lines[1]
    assert STATE.policy.env_mode is None and STATE.policy.mode_for("grad_health") == "observe"


def test_an_unreadable_policy_gives_way_to_the_default_preset(tmp_path, capsys, stops):
    (tmp_path / "autograd_guard.toml").write_text('mode = "observe"\nx = [\n')
    _engine.install_from_environment({"AUTOGRAD_GUARD": "1"})
    lines = capsys.readouterr().err.splitlines()
    path = tmp_path / "autograd_guard.toml"
    assert lines[0] == (
        f"autograd-guard: cannot use the policy {path}; running the shipped default preset "
        "instead (1 problem; 'autograd-guard check' lists them):"
    )
    assert lines[1].startswith(f"autograd-guard: {path}: invalid TOML: ")
    assert STATE.policy.source == "preset default" and STATE.policy.mode == "fix"


@pytest.mark.parametrize("value", ["stdrr", "Stder", "loging"])
def test_a_near_miss_of_a_log_keyword_keeps_events_on_stderr(tmp_path, capsys, stops, value):
    (tmp_path / "autograd_guard.toml").write_text(f'log = "{value}"\n')
    _engine.install_from_environment({"AUTOGRAD_GUARD": "1"})
    assert "did you mean" in capsys.readouterr().err
    assert STATE.log == "stderr" and not (tmp_path / value).exists()
    _engine.install_from_environment({"AUTOGRAD_GUARD": "1", "AUTOGRAD_GUARD_LOG": value})
    assert STATE.log == "stderr"


@pytest.mark.parametrize("value", ["stderr.log", "./logging", "events"])
def test_a_log_file_name_is_no_near_miss(tmp_path, stops, value):
    _engine.install_from_environment({"AUTOGRAD_GUARD": "1", "AUTOGRAD_GUARD_LOG": value})
    assert STATE.log == value and STATE.policy.warnings == []


def test_strict_stops_with_status_2_and_says_it_once(tmp_path, capsys, stops):
    (tmp_path / "autograd_guard.toml").write_text(PROBLEMS.replace("loud", "strcit"))
    with pytest.raises(Stopped):  # torch is imported already here: it stops at once
        _engine.install_from_environment({"AUTOGRAD_GUARD": "1"})
    assert stops == [2]
    lines = capsys.readouterr().err.splitlines()
    path = tmp_path / "autograd_guard.toml"
    assert lines[0] == (
        f"autograd-guard: invalid policy in strict mode (mode = 'strcit' in {path}): stopped "
        "at the import of torch, exit status 2 (3 problems to fix; or unset AUTOGRAD_GUARD):"
    )
    assert len(lines) == 4 and lines[2].endswith(
        "did you mean 'strict'? (allowed: 'off', 'observe', 'fix', 'strict')"
    )


def test_the_command_line_is_never_stopped(tmp_path, capsys, stops):
    (tmp_path / "autograd_guard.toml").write_text(PROBLEMS)
    STATE.muted = True  # as the bootstrap sets it for the autograd-guard command
    _engine.install_from_environment({"AUTOGRAD_GUARD": "strict"})
    assert stops == [] and capsys.readouterr().err == ""
    assert "speed: unknown key" in STATE.error


@pytest.mark.parametrize(
    ("environ", "policy", "subject"),
    [
        ({"AUTOGRAD_GUARD": "stirct"}, None, "invalid AUTOGRAD_GUARD value in strict mode"),
        (
            {"AUTOGRAD_GUARD": "stirct"},
            'mode = "loud"\n',
            "invalid policy and AUTOGRAD_GUARD value in strict",
        ),
        ({"AUTOGRAD_GUARD": "1"}, 'mode = "strcit"\n', "invalid policy in strict mode"),
        (
            {"AUTOGRAD_GUARD": "1", "AUTOGRAD_GUARD_POLICY": "nope"},
            None,
            "cannot use the policy named by AUTOGRAD_GUARD_POLICY; running the shipped default",
        ),
    ],
)
def test_the_headline_names_what_is_invalid(
    tmp_path, capsys, stops, monkeypatch, environ, policy, subject
):
    """A mistyped variable is no invalid policy: the headline says which it is."""
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    if policy is not None:
        (tmp_path / "autograd_guard.toml").write_text(policy)
    try:
        _engine.install_from_environment(environ)
    except Stopped:
        assert stops == [2]
    headline = capsys.readouterr().err.splitlines()[0]
    assert headline.startswith(f"autograd-guard: {subject}")
    assert ("invalid policy" in headline) == (policy is not None)
    assert stops == ([2] if "strict" in subject else [])


def test_a_key_with_control_characters_is_printed_escaped(tmp_path, capsys, stops):
    (tmp_path / "autograd_guard.toml").write_text('"\\u001b[2Jevil" = 1\n')
    _engine.install_from_environment({"AUTOGRAD_GUARD": "1"})
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[2Jevil: unknown key" in err


def _said(err: str) -> list[str]:
    """The start-up lines of ``err``, without the events of guards that meet libraries
    earlier tests imported (``late_patch`` notes)."""
    return [line for line in err.splitlines() if line.startswith("autograd-guard: ")]
