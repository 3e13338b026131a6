"""What a user reads when a setting is wrong: quoted booleans and numbers, keywords in
another case, a folder where the policy file goes, counts in the singular, an unknown
guard given to ``report``, and ``check`` agreeing with a run on a rule's module."""

from __future__ import annotations

import json

import pytest

from autograd_guard import cli
from autograd_guard._engine import engine as _engine
from autograd_guard._policy import policy as _policy
from autograd_guard.errors import PolicyError
from autograd_guard.guards import available

GUARDS = available()


def load(data, environ=None):
    return _policy.load(data, GUARDS, environ=environ or {})


def problem(data) -> str:
    with pytest.raises(PolicyError) as info:
        load(data)
    return str(info.value)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("false", "a string where a boolean is expected; write false without quotes"),
        ("True", "a string where a boolean is expected; write true without quotes"),
    ],
)
def test_a_quoted_boolean_says_the_quotes_are_the_problem(value, says):
    text = problem({"guards": {"grad_health": {"enabled": value}}})
    assert text == (
        f"<dict>: guards.grad_health.enabled: invalid value {value!r}: {says} "
        "(allowed: true or false)"
    )


def test_a_quoted_number_says_so_too():
    text = problem({"guards": {"grad_health": {"lost_steps": "30"}}})
    assert "invalid value '30': a string where an integer is expected; write 30 without" in text
    assert "quotes" not in problem({"guards": {"grad_health": {"enabled": "yes"}}})


def test_keywords_are_read_in_any_case_in_the_policy_and_the_variables():
    policy = load(
        {
            "extends": "Default",
            "mode": "Strict",
            "disable": ["IPEX_XPU"],
            "log": "StdErr",
            "guards": {"warp_torch_args": {"mode": "OBSERVE", "action": "Snapshot"}},
            "rules": [{"target": "my.stages:fit", "action": "Enable_Grad"}],
        },
        {"AUTOGRAD_GUARD": "Observe", "AUTOGRAD_GUARD_DISABLE": "Grad_Mode"},
    )
    assert (policy.mode, policy.env_mode, policy.log) == ("strict", "observe", "stderr")
    assert policy.disabled == {"ipex_xpu", "grad_mode"} and policy.warnings == []
    warp = policy.guards["warp_torch_args"]
    assert (warp.mode, warp.options["action"]) == ("observe", "snapshot")
    rules = load({"rules": [{"target": "my.stages:fit", "action": "SNAPSHOT", "check": "Data"}]})
    assert (rules.rules[0].action, rules.rules[0].options["check"]) == ("snapshot", "data")
    preset = load(None, {"AUTOGRAD_GUARD_POLICY": "Strict"})
    assert (preset.source, preset.mode) == ("preset strict", "strict")


def test_a_folder_named_like_the_policy_file_is_named(tmp_path, capsys):
    (tmp_path / "autograd_guard.toml").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.autograd_guard]\nmode = "observe"\n')
    assert cli.main(["check"]) == 1
    assert capsys.readouterr().err == (
        f"invalid policy: {tmp_path / 'autograd_guard.toml'}: a folder, not a policy file "
        "(allowed: a TOML file named autograd_guard.toml)\n"
    )
    _engine.install_from_environment({"AUTOGRAD_GUARD": "1"})  # and a run says it
    assert "a folder, not a policy file" in capsys.readouterr().err


def write_log(path, lines):
    path.write_text("\n".join(lines) + "\n")


EVENT = {"guard": "grad_health", "action": "nonfinite", "callsite": "t.py:3", "process": "p"}


def test_report_counts_in_the_singular_and_plural(tmp_path, capsys):
    log = tmp_path / "events.jsonl"
    write_log(log, [json.dumps(EVENT), "not json"])
    assert cli.main(["report", str(log)]) == 0
    assert "in 1 process; 1 unreadable line\n" in capsys.readouterr().out
    write_log(log, [json.dumps(EVENT), "not json", "[]"])
    assert cli.main(["report", str(log)]) == 0
    assert "in 1 process; 2 unreadable lines\n" in capsys.readouterr().out


def test_report_names_an_unknown_guard_with_the_closest_one(tmp_path, capsys):
    log = tmp_path / "events.jsonl"
    write_log(log, [json.dumps(EVENT)])
    assert cli.main(["report", str(log), "--guard", "grad_helth"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(
        "--guard: unknown guard 'grad_helth'; did you mean 'grad_health'? (allowed: "
    )
    assert cli.main(["report", str(log), "--guard", "grad_mode"]) == 0  # known, no events
    assert capsys.readouterr().out.startswith("0 interventions at 0 call sites")


def test_check_says_ok_in_the_singular(tmp_path, capsys):
    (tmp_path / "autograd_guard.toml").write_text(
        '[[rules]]\ntarget = "json_tools:run"\naction = "enable_grad"\n'
    )
    (tmp_path / "json_tools.py").write_text("def run():\n    pass\n")
    assert cli.main(["check"]) == 0
    assert capsys.readouterr().out.endswith("(mode fix, 1 rule)\n")


def test_a_missing_rule_module_is_a_warning_in_check_as_in_a_run(tmp_path, capsys):
    policy = tmp_path / "autograd_guard.toml"
    policy.write_text('[[rules]]\ntarget = "fitlb.train:fit"\naction = "enable_grad"\n')
    assert cli.main(["check"]) == 0
    out, err = capsys.readouterr()
    assert out == f"ok: {policy} (mode fix, 1 rule; 1 warning)\n"
    assert err.startswith(f"warning: {policy}: rules[0].target: no module 'fitlb' can be found")
    assert err.endswith("a run cannot attach it and names it at exit (unattached_rules)\n")
    assert cli.main(["check", "--strict"]) == 1
    capsys.readouterr()
    _engine.install_from_environment({"AUTOGRAD_GUARD": "1"})  # a run takes the policy
    # and says nothing of the rule at start (other guards may note libraries imported earlier)
    assert "fitlb" not in capsys.readouterr().err
    assert _engine.status()["installed"] and _engine.status()["error"] is None
