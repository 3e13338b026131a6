"""`autograd-guard check` and policy messages as a newcomer meets them (issue 21): every
problem at once, each with the file, the key, what is allowed and a "did you mean"; rule
modules resolved without importing anything; a fresh `init` file that checks clean."""

from __future__ import annotations

import sys

import pytest

from autograd_guard import cli
from autograd_guard._policy import policy as _policy
from autograd_guard.errors import PolicyError
from autograd_guard.guards import available


def check(capsys, *args: str) -> tuple[int, str, str]:
    status = cli.main(["check", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_check_reports_every_problem_at_once(tmp_path, capsys):
    (tmp_path / "p.toml").write_text(
        '[guards.grad_health]\nlost_step = 5\nnonfinite = "yes"\n'
        '[guards.warp_torch_args]\naction = "convrt"\n'
    )
    status, _, err = check(capsys, "p.toml")
    assert status == 1
    assert err.splitlines() == [
        "invalid policy: p.toml: guards.grad_health.lost_step: unknown key; did you mean "
        "'lost_steps'? (allowed: enabled, mode, force, lost_steps, nonfinite, localize_steps, "
        "nonfinite_fix, stall_steps, on_stall, exchange_timeout, exchange_ddp, zero_steps)",
        "invalid policy: p.toml: guards.grad_health.nonfinite: invalid value 'yes' "
        "(allowed: true or false)",
        "invalid policy: p.toml: guards.warp_torch_args.action: invalid value 'convrt'; "
        "did you mean 'convert'? (allowed: 'convert', 'snapshot')",
    ]


def test_load_raises_every_problem_on_one_line(tmp_path):
    (tmp_path / "p.toml").write_text('mode = "fixx"\ncolour = 1\n[[rules]]\naction = "snapshot"\n')
    with pytest.raises(PolicyError) as info:
        _policy.load(str(tmp_path / "p.toml"), available(), environ={})
    assert [(p.key, p.suggestion) for p in info.value.problems] == [
        ("colour", ""),
        ("mode", "fix"),
        ("rules[0].target", ""),
    ]
    assert "\n" not in str(info.value) and str(info.value).count(" | ") == 2


@pytest.fixture
def fitlib(tmp_path):
    """A package whose import would stop the test: `check` must never run it."""
    package = tmp_path / "fitlib"
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('fitlib was imported')\n")
    (package / "train.py").write_text("raise SystemExit('fitlib.train was imported')\n")
    yield package
    assert not any(name.startswith("fitlib") for name in sys.modules)


def rule(target: str) -> str:
    return f'[[rules]]\ntarget = "{target}"\naction = "enable_grad"\n'


def test_check_resolves_the_whole_module_path_without_importing(tmp_path, capsys, fitlib):
    policy = tmp_path / "autograd_guard.toml"
    policy.write_text(rule("fitlib.train:fit"))
    assert check(capsys, str(policy))[0] == 0
    policy.write_text(rule("fitlib.trian:fit") + rule("fitlib.train.deep:fit") + rule("fitlb:f"))
    status, _, err = check(capsys, str(policy))
    assert status == 1  # a module that the installed package lacks is a typo: a problem
    lines = err.splitlines()
    attach = ": a run cannot attach it and names it at exit (unattached_rules)"
    assert lines[1] == (
        f"invalid policy: {policy}: rules[0].target: package 'fitlib' ({fitlib}) has no "
        f"module 'trian'; did you mean 'fitlib.train'? (for 'fitlib.trian:fit'){attach}"
    )
    assert lines[2] == (
        f"invalid policy: {policy}: rules[1].target: 'fitlib.train' is a module, not a "
        f"package: it has no submodule 'deep' (for 'fitlib.train.deep:fit'){attach}"
    )
    assert lines[0].startswith(f"warning: {policy}: rules[2].target: no module 'fitlb' ")
    assert "did you mean 'fitlib'?" in lines[0] and len(lines) == 3


def test_a_package_that_is_not_installed_is_a_warning_that_strict_fails(tmp_path, capsys):
    policy = tmp_path / "autograd_guard.toml"
    policy.write_text(rule("notinstalledpkg.train:fit"))
    status, out, err = check(capsys, str(policy))
    assert status == 0 and out.startswith("ok: ") and "1 warning" in out
    assert err.startswith(f"warning: {policy}: rules[0].target: no module 'notinstalledpkg' ")
    assert check(capsys, "--strict", str(policy))[0] == 1


@pytest.mark.parametrize(("where", "value"), [("policy", "stdrr"), ("variable", "loging")])
def test_a_near_miss_of_a_log_keyword_is_a_problem(tmp_path, capsys, monkeypatch, where, value):
    policy = tmp_path / "autograd_guard.toml"
    policy.write_text(f'log = "{value}"\n' if where == "policy" else "")
    if where == "variable":
        monkeypatch.setenv("AUTOGRAD_GUARD_LOG", value)
    status, _, err = check(capsys, str(policy))
    assert status == 1 and "looks like a typo of one; events go to stderr" in err
    assert "did you mean 'stderr'?" in err if value == "stdrr" else "'logging'?" in err
    assert not (tmp_path / value).exists()


def test_init_writes_a_file_that_checks_clean(tmp_path, capsys):
    assert cli.main(["init"]) == 0
    capsys.readouterr()
    status, out, err = check(capsys)
    assert (status, err) == (0, "")
    assert out == f"ok: {tmp_path / 'autograd_guard.toml'} (mode fix, 0 rules)\n"


def test_a_path_that_exists_is_a_path(tmp_path, capsys):
    (tmp_path / "guardpolicy").write_text('mode = "observe"\n')
    status, out, _ = check(capsys, "guardpolicy")
    assert status == 0 and out == "ok: guardpolicy (mode observe, 0 rules)\n"
    status, _, err = check(capsys, "guardpolicyy")
    assert status == 1
    assert "no preset or policy file named 'guardpolicyy'" in err
    (tmp_path / "strict").mkdir()  # a folder is never a policy: the preset
    assert "ok: preset strict (mode strict" in check(capsys, "strict")[1]


def test_messages_say_it_once_in_words(tmp_path, capsys):
    (tmp_path / "p.toml").write_text(
        'extends = "defualt"\n[guards.ipex_xpu]\ncrosscheck_atol = -1\n'
    )
    _, _, err = check(capsys, "p.toml")
    assert err.splitlines() == [
        "invalid policy: p.toml: extends: no preset or policy file named 'defualt'; did you "
        "mean 'default'? (allowed: a preset name (default, observe, strict, unique3d) or a "
        "policy file path)",
        "invalid policy: p.toml: guards.ipex_xpu.crosscheck_atol: invalid value -1.0 "
        "(allowed: a number >= 0)",
    ]


def test_unknown_guard_in_the_disable_variable_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AUTOGRAD_GUARD_DISABLE", "grad_helth,grad_mode")
    line = (
        "AUTOGRAD_GUARD_DISABLE: unknown guard 'grad_helth', ignored; did you mean "
        "'grad_health'? (allowed: *, grad_mode,"
    )
    status, _, err = check(capsys)
    assert status == 0 and err.startswith(f"warning: {line}")
    import autograd_guard

    autograd_guard.install()  # the guard runs on, and says it once where the user sees it
    # One line (the others are events, of libraries that earlier tests imported).
    notices = [n for n in capsys.readouterr().err.splitlines() if "AUTOGRAD_GUARD_DISABLE" in n]
    assert len(notices) == 1 and notices[0].startswith(f"autograd-guard: {line}")
    assert autograd_guard.status()["guards"]["grad_mode"]["mode"] == "off"


def test_log_keywords_are_case_insensitive(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOGRAD_GUARD_LOG", "Stderr")
    assert _policy.load(None, available()).log == "stderr"
    monkeypatch.delenv("AUTOGRAD_GUARD_LOG")
    (tmp_path / "autograd_guard.toml").write_text('log = "LOGGING"\n')
    assert _policy.load(None, available()).log == "logging"


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ('disable = ["acme_nerf_guard", "acme_nerf_guard"]\n', "disable"),
        ("[guards.acme_nerf_guard]\nenabled = false\n", "guards.acme_nerf_guard"),
    ],
)
def test_disabling_a_guard_that_is_not_installed_is_a_warning(
    tmp_path, capsys, monkeypatch, table, key
):
    """It is off, as asked: said once, in check's words and a run's, and a strict policy
    runs (as AUTOGRAD_GUARD_DISABLE=acme_nerf_guard does)."""
    from autograd_guard._engine import engine as _engine
    from autograd_guard._policy import failure as _policy_failure

    path = tmp_path / "autograd_guard.toml"
    path.write_text('mode = "strict"\n' + table)
    line = f"{path}: {key}: unknown guard 'acme_nerf_guard', ignored (allowed: "
    status, out, err = check(capsys)
    assert status == 0 and "(mode strict, 0 rules; 1 warning)" in out
    assert err.startswith(f"warning: {line}") and len(err.splitlines()) == 1
    assert check(capsys, "--strict")[0] == 1
    monkeypatch.setattr(_policy_failure.os, "_exit", pytest.fail)  # never stops
    _engine.install_from_environment({"AUTOGRAD_GUARD": "1"})
    said = [n for n in capsys.readouterr().err.splitlines() if "acme_nerf_guard" in n]
    assert len(said) == 1 and said[0].startswith(f"autograd-guard: {line}")
    assert autograd_guard_status()["guards"]["grad_mode"]["mode"] == "strict"


def autograd_guard_status():
    import autograd_guard

    return autograd_guard.status()


@pytest.mark.parametrize(
    ("table", "key", "hint"),
    [
        ('disable = ["grad_helth"]\n', "disable", "; did you mean 'grad_health'?"),
        ("[guards.Grad_Helth]\nenabled = false\n", "guards.Grad_Helth", "; did you mean"),
    ],
)
def test_a_typo_of_a_guard_to_disable_gets_a_did_you_mean(tmp_path, capsys, table, key, hint):
    (tmp_path / "p.toml").write_text(table)
    status, _, err = check(capsys, "p.toml")
    assert status == 0 and err.startswith(f"warning: p.toml: {key}: unknown guard ")
    assert hint in err and "'grad_health'?" in err


@pytest.mark.parametrize(
    "table", ["enabled = true\n", 'mode = "observe"\n', "enabled = false\nforce = true\n"]
)
def test_settings_for_a_guard_that_is_not_installed_are_an_error(tmp_path, capsys, table):
    """They cannot take effect: the user expects a guard that is not there."""
    (tmp_path / "p.toml").write_text("[guards.acme_nerf_guard]\n" + table)
    status, _, err = check(capsys, "p.toml")
    assert status == 1
    assert err.startswith("invalid policy: p.toml: guards.acme_nerf_guard: unknown guard ")


def test_a_mistyped_variable_is_an_invalid_setting_not_policy(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AUTOGRAD_GUARD", "stirct")
    status, _, err = check(capsys)
    assert status == 1
    assert err.startswith("invalid setting: AUTOGRAD_GUARD: invalid value 'stirct'; did you ")
