"""The autograd-guard command and the pytest plugin."""

from __future__ import annotations

import json
import sys

import pytest

from autograd_guard import cli

pytest_plugins = ["pytester"]


def test_doctor(capsys, monkeypatch):
    monkeypatch.setenv("AUTOGRAD_GUARD_DISABLE", "grad_mode")
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "python" in out and "torch         2." in out
    assert "AUTOGRAD_GUARD_DISABLE='grad_mode'" in out
    assert "policy        preset default" in out
    assert "grad_mode mode=off" in " ".join(out.split())
    assert ".pth" in out
    assert "supported     Python 3.10-3.13, torch 2.1-2.15" in out
    assert "untested" not in out  # the suite runs only on supported versions


def test_versions_outside_the_matrix_are_named():
    from autograd_guard._common.versions import support_note

    assert support_note("3.10.13", "2.1.2") == support_note("3.13.0", "2.15.0+cu130") == ""
    assert support_note("3.9.18", "2.13.0").startswith("untested: Python 3.9.18 (supported:")
    assert "torch 2.0.1" in support_note("3.11.7", "2.0.1")


def test_doctor_reports_an_invalid_policy(tmp_path, capsys):
    (tmp_path / "autograd_guard.toml").write_text('mode = 1\nlog = "stdrr"\n')
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert f"policy        {tmp_path / 'autograd_guard.toml'}\n" in out
    assert f"              found from the working directory {tmp_path} up\n" in out
    assert "  2 problems (a run ignores each; see 'autograd-guard check'):\n" in out
    assert "did you mean 'stderr'?" in out and "\nlog           stderr\n" in out


def test_doctor_says_where_strict_stops_a_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AUTOGRAD_GUARD", "strict")
    (tmp_path / "autograd_guard.toml").write_text("x = [\n")
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "policy        preset default\n" in out and "autograd_guard.toml cannot be used" in out
    assert "  1 problem (strict: a run stops at its import of torch; see " in out


def test_doctor_names_the_policy_beside_a_program_and_why(tmp_path, capsys):
    app = tmp_path / "app"
    app.mkdir()
    (app / "autograd_guard.toml").write_text('mode = "observe"\n')
    (tmp_path / "autograd_guard.toml").write_text('mode = "fix"\n')
    assert cli.main(["doctor", "app/train.py"]) == 0
    out = capsys.readouterr().out
    assert f"policy        {app / 'autograd_guard.toml'}\n" in out
    assert f"found from the program's folder {app} up\n" in out and "mode          observe" in out
    assert cli.main(["doctor"]) == 0
    assert f"found from the working directory {tmp_path} up\n" in capsys.readouterr().out


def test_check_and_init(tmp_path, capsys):
    assert cli.main(["init"]) == 0
    assert cli.main(["check", "autograd_guard.toml"]) == 0
    assert "ok: autograd_guard.toml (mode fix, 0 rules)" in capsys.readouterr().out
    assert cli.main(["init"]) == 1  # never overwrites silently
    (tmp_path / "bad.toml").write_text('[guards.grad_mode]\nmode = "loud"\n')
    assert cli.main(["check", "bad.toml"]) == 1
    err = capsys.readouterr().err
    assert "bad.toml: guards.grad_mode.mode: invalid value 'loud'" in err


def test_report(tmp_path, capsys):
    log = tmp_path / "events.jsonl"
    records = [
        {
            "guard": "grad_mode",
            "action": "enable_grad",
            "callsite": "a.py:1",
            "pid": 1,
            "event": "stage entered",
        },
        {
            "guard": "grad_mode",
            "action": "enable_grad",
            "callsite": "a.py:1",
            "pid": 2,
            "event": "stage entered",
        },
        {
            "guard": "autograd_guard",
            "action": "summary",
            "callsite": "-",
            "pid": 1,
            "sites": ["grad_mode/enable_grad at a.py:1 x40"],
        },
    ]
    log.write_text("\n".join(json.dumps(r) for r in records) + "\nnot json\n")
    assert cli.main(["report", str(log)]) == 0
    out = capsys.readouterr().out
    assert "41 interventions at 1 call site in 2 processes; 1 unreadable line" in out
    assert out.splitlines()[1:] == [
        "guard      action       count  call site  event",
        "grad_mode  enable_grad     41  a.py:1     stage entered",
    ]


def _event(process, action="enable_grad", callsite="a.py:1", guard="grad_mode"):
    return {"guard": guard, "action": action, "callsite": callsite, "pid": 7, "process": process}


def _summary(process, *sites):
    return {
        "guard": "autograd_guard",
        "action": "summary",
        "callsite": "-",
        "pid": 7,
        "process": process,
        "sites": list(sites),
    }


def test_report_tells_apart_processes_that_share_a_pid(tmp_path, capsys):
    log = tmp_path / "events.jsonl"
    records = [
        _event("7-a"),
        _summary("7-a", "grad_mode/enable_grad at a.py:1 x3"),
        _event("7-b"),  # another container, the same PID
        _summary("7-b", "grad_mode/enable_grad at a.py:1 x5"),
        _event("7-b", callsite="b.py:2"),  # logged by an atexit handler after the summary
        _event("7-b", action="late_patch", callsite="x:f", guard="gsplat_means2d"),
        _event("7-b", action="guard_error", callsite="check:KeyError"),
    ]
    log.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    assert cli.main(["report", str(log)]) == 0
    out = capsys.readouterr().out
    first = "9 interventions at 2 call sites; 1 note; 1 guard error in 2 processes"
    assert out.splitlines()[0] == first
    rows = [line.split() for line in out.splitlines()[2:]]
    assert ["grad_mode", "enable_grad", "8", "a.py:1"] in rows
    assert ["grad_mode", "enable_grad", "1", "b.py:2"] in rows


def test_summary_words(capsys):
    from autograd_guard._events import actions as _actions

    one = [{"guard": "g", "action": "a", "callsite": "c", "count": 1}]
    assert _actions.describe_counts(one) == "1 intervention at 1 call site"
    note = [{"guard": "g", "action": "late_patch", "callsite": "c", "count": 1}]
    assert _actions.describe_counts(one + note) == "1 intervention at 1 call site; 1 note"
    # a steps_skipped note is no error: the guard's own errors are counted apart
    skipped = [{"guard": "grad_health", "action": "steps_skipped", "callsite": "c", "count": 2}]
    errors = [{"guard": "g", "action": "guard_error", "callsite": "check:KeyError", "count": 1}]
    assert _actions.describe_counts(one + skipped + errors) == (
        "1 intervention at 1 call site; 2 notes; 1 guard error"
    )


def test_run_needs_a_command(capsys):
    assert cli.main(["run", "--"]) == 2


def test_pytest_plugin_strict_and_fixture(pytester: pytest.Pytester):
    package = pytester.mkpydir("mesh_reconstruction")
    (package / "recon.py").write_text(
        "import torch\n"
        "def reconstruct_stage1(x):\n"
        "    w = torch.zeros(1, requires_grad=True)\n"
        "    ((w - x) ** 2).sum().backward()\n"
        "    return w.grad\n"
    )
    pytester.makepyfile(
        test_stage="""
        import torch
        from mesh_reconstruction.recon import reconstruct_stage1

        def test_stage(autograd_guard_events):
            with torch.no_grad():
                reconstruct_stage1(torch.ones(1))
            assert [e["guard"] for e in autograd_guard_events] == ["grad_mode"]
    """
    )
    pytester.makefile(".toml", autograd_guard='extends = "unique3d"')
    pytester.syspathinsert()
    assert pytester.runpytest_subprocess("--autograd-guard=fix").ret == 0
    strict = pytester.runpytest_subprocess("--autograd-guard=strict")
    assert strict.ret == 1
    strict.stdout.fnmatch_lines(["*GuardError*grad_mode*"])


def test_pytest_warns_when_the_variable_is_set_but_the_pth_did_not_run(pytester, monkeypatch):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    monkeypatch.setenv("AUTOGRAD_GUARD", "1")
    # -S: site (and so every .pth) is skipped, as when an installer drops the .pth.
    result = pytester.run(
        sys.executable,
        "-S",
        "-c",
        f"import sys; sys.path[:0] = {sys.path!r}; import pytest; sys.exit(pytest.main(['-q']))",
    )
    assert result.ret == 0
    assert "AUTOGRAD_GUARD is set but autograd_guard.pth was not processed" in result.stderr.str()


def test_check_names_a_rule_whose_module_is_missing_without_importing(tmp_path, capsys):
    (tmp_path / "present.py").write_text("raise SystemExit('imported!')\n")
    policy = tmp_path / "autograd_guard.toml"
    policy.write_text(
        '[[rules]]\ntarget = "present:run"\naction = "enable_grad"\n'
        '[[rules]]\ntarget = "my_pipline.stages:fit"\naction = "enable_grad"\n'
    )
    assert cli.main(["check", "--strict"]) == 1
    err = capsys.readouterr().err
    assert f"{policy}: rules[1].target: no module 'my_pipline' can be found here" in err
    assert "present" not in sys.modules and "rules[0]" not in err


def test_check_names_a_log_path_that_cannot_be_written(tmp_path, capsys):
    (tmp_path / "autograd_guard.toml").write_text('log = "no/such/folder/events.jsonl"\n')
    assert cli.main(["check"]) == 1
    err = capsys.readouterr().err
    assert "the 'log' key of" in err and "does not exist" in err
    (tmp_path / "autograd_guard.toml").write_text('log = "events.jsonl"\n')
    assert cli.main(["check"]) == 0


def test_version_and_help(capsys):
    from autograd_guard import __version__

    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out == f"autograd-guard {__version__}\n"
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    top = capsys.readouterr().out
    assert "``" not in top and "doctor" in top and "report" in top
    for command, words in (
        ("doctor", "policy in force"),
        ("check", "without importing"),
        ("init", "./autograd_guard.toml"),
        ("run", "where .pth files are not processed"),
        ("report", "JSON-lines event log"),
    ):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        assert words in " ".join(capsys.readouterr().out.split()), command


def test_doctor_into_a_closed_pipe_ends_quietly(tmp_path):
    import subprocess

    # `true` leaves before the first line is written, as `head` does after its lines.
    result = subprocess.run(
        f"{sys.executable} -m autograd_guard.cli doctor | true",
        shell=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.stderr == ""


def test_report_counts_json_of_another_shape_as_unreadable(tmp_path, capsys):
    # Issue 19 item 10: valid JSON, but not an event of ours: counted, never a traceback.
    log = tmp_path / "events.jsonl"
    odd = [
        [1, 2],
        "text",
        7,
        {"guard": ["grad_mode"], "action": "enable_grad", "callsite": "a.py:1"},
        {"guard": "grad_mode", "action": 3, "callsite": "a.py:1"},
        {"guard": "grad_mode", "action": "enable_grad", "callsite": {"x": 1}},
        {"guard": "g", "action": "a", "callsite": "c", "process": [1]},
        {**_summary("7-a"), "sites": 5},
        {**_summary("7-a"), "sites": [1, "grad_mode/enable_grad at a.py:1 x2"]},
    ]
    lines = [json.dumps(r) for r in [_event("7-a"), *odd]]
    lines.append("[" * 100_000 + "]" * 100_000)  # deeper than the parser can go
    log.write_text("\n".join(lines) + "\n")
    assert cli.main(["report", str(log)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (
        f"1 intervention at 1 call site in 1 process; {len(odd) + 1} unreadable lines"
    )


def test_check_names_a_policy_nested_too_deeply_without_a_traceback(tmp_path, capsys):
    # Issue 19 item 8: the TOML parser's RecursionError is a policy error.
    for body in ("x = " + "[" * 5000 + "]" * 5000, "a = " + "{b = " * 5000 + "1" + "}" * 5000):
        (tmp_path / "deep.toml").write_text(body + "\n")
        assert cli.main(["check", "deep.toml"]) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert err == (
            "invalid policy: deep.toml: arrays or tables nested too deeply to parse "
            "(allowed: a few levels of nesting, as a policy needs)\n"
        )
