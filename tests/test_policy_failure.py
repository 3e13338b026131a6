"""A policy the auto-load cannot use: where strict was asked for (in so many words or by a
near miss) the process stops at start; otherwise it runs unguarded after one headline and
one line per problem, printed once."""

from __future__ import annotations

import pytest

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
    return statuses


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


def test_unguarded_one_headline_and_one_line_per_problem_once(tmp_path, capsys, stops):
    (tmp_path / "autograd_guard.toml").write_text(PROBLEMS)
    _engine.install_from_environment({"AUTOGRAD_GUARD": "1"})
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        "autograd-guard: invalid policy; running unguarded (3 problems to fix; "
        "'autograd-guard check' lists them):"
    )
    path = tmp_path / "autograd_guard.toml"
    assert lines[1:] == [
        f"  {path}: speed: unknown key (allowed: extends, mode, log, disable, guards, rules)",
        f"  {path}: mode: invalid value 'loud' (allowed: 'off', 'observe', 'fix', 'strict')",
        f"  {path}: guards.grad_mode.mod: unknown key; did you mean 'mode'? (allowed: enabled, "
        "mode, force)",
    ]
    assert stops == [] and STATE.policy is None and "speed: unknown key" in STATE.error


def test_one_problem_in_the_singular(tmp_path, capsys, stops):
    (tmp_path / "autograd_guard.toml").write_text('mode = "loud"\n')
    _engine.install_from_environment({"AUTOGRAD_GUARD": "1"})
    assert "(1 problem to fix; " in capsys.readouterr().err.splitlines()[0]


def test_a_log_file_gets_the_event_and_stderr_the_lines(tmp_path, capsys, stops):
    import json

    (tmp_path / "autograd_guard.toml").write_text(PROBLEMS)
    log = tmp_path / "events.jsonl"
    _engine.install_from_environment({"AUTOGRAD_GUARD": "1", "AUTOGRAD_GUARD_LOG": str(log)})
    assert len(capsys.readouterr().err.splitlines()) == 4
    (record,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["action"] == "disabled" and len(record["problems"]) == 3


def test_strict_stops_with_status_2_and_says_it_once(tmp_path, capsys, stops):
    (tmp_path / "autograd_guard.toml").write_text(PROBLEMS.replace("loud", "strcit"))
    with pytest.raises(Stopped):
        _engine.install_from_environment({"AUTOGRAD_GUARD": "1"})
    assert stops == [2]
    lines = capsys.readouterr().err.splitlines()
    path = tmp_path / "autograd_guard.toml"
    assert lines[0] == (
        f"autograd-guard: invalid policy in strict mode (mode = 'strcit' in {path}): stopped "
        "before the program ran, exit status 2 (3 problems to fix; or unset AUTOGRAD_GUARD):"
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
        ({"AUTOGRAD_GUARD": "stirct"}, 'mode = "loud"\n', "invalid policy and AUTOGRAD_GUARD"),
        ({"AUTOGRAD_GUARD": "1"}, 'mode = "strcit"\n', "invalid policy in strict mode"),
        (
            {"AUTOGRAD_GUARD": "1", "AUTOGRAD_GUARD_POLICY": "nope"},
            None,
            "invalid AUTOGRAD_GUARD_POLICY",
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
