"""`autograd-guard --help` and `doctor` as a newcomer reads them (issue 21): whole
summaries, no event lines of the guard's own, advice that fits the install, each guard's
verdict said once, its symptom and upstream report."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import wheelenv
from helpers import ROOT
from test_third_party import distribution

from autograd_guard import cli
from autograd_guard.guards import builtin


def test_help_keeps_each_summary_whole(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    for summary, _ in cli.COMMANDS.values():
        assert summary in out
    assert "Validate a policy file and report every problem." in out


def test_doctor_shows_each_guard_once_with_its_symptom_and_upstream(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "affected (affected" not in out and "rules: none" not in out
    words = " ".join(out.split())
    assert "warp_torch_args mode=fix warp-lang not installed (affected: >=1.3.0,<1.6.0)" in words
    assert "grad_health mode=fix every version (watches torch.optim.optimizer)" in words
    assert "snapshot_inputs mode=fix no rules in the policy: nothing to do" in words
    for guard in builtin():
        assert f"symptom   {guard.symptom}" in out
        if guard.upstream:
            assert f"upstream  {guard.upstream}" in out


def test_verdicts_say_affected_once():
    from autograd_guard._policy import policy as _policy
    from autograd_guard.guards.warp_torch_args import GUARD

    guard = GUARD(_policy.load({}, builtin(), environ={}))
    guard.read_version = lambda: None  # a stand-in installed version, no metadata read
    guard.installed_as, guard.version = "warp-lang", "1.5.1"
    assert guard.needed()[1] == "warp-lang 1.5.1: affected (>=1.3.0,<1.6.0)"
    guard.version = "1.19.0"
    assert guard.needed()[1] == "warp-lang 1.19.0: not affected (only >=1.3.0,<1.6.0 are)"


def test_doctor_and_check_print_no_event_of_the_guards_own(tmp_path):
    site = tmp_path / "site"
    distribution(
        site,
        "brokenguard",
        "broken = brokenguard:BrokenGuard\n",
        {"brokenguard": "raise ImportError('brokenguard needs a missing library')\n"},
    )
    # With the variable set and no cache, the auto-load of the command's own process loads
    # the guards at start-up too.
    settings = ({}, {"AUTOGRAD_GUARD": "1", "AUTOGRAD_GUARD_CACHE": "off"})
    for command, env in itertools.product(("doctor", "check"), settings):
        result = subprocess.run(
            [sys.executable, "-m", "autograd_guard.cli", command],
            cwd=tmp_path,
            env=wheelenv.clean_environ(PYTHONPATH=f"{ROOT}:{site}", **env),
            capture_output=True,
            text=True,
            check=False,
        )
        output = result.stdout + result.stderr
        assert "load_error" not in output and "summary" not in output, output
        assert "autograd-guard" not in result.stderr, (command, env)
        if command == "doctor":
            unavailable = "broken third-party guard from brokenguard: UNAVAILABLE"
            assert unavailable in " ".join(result.stdout.split())


def test_doctor_advice_fits_a_target_folder(tmp_path, wheel):
    """A `pip install --target` folder on PYTHONPATH: .pth files are not read there, and
    reinstalling without --editable would not help."""
    target = tmp_path / "target"
    wheelenv.pip_install_target(target, str(wheel), "--no-index")
    python = wheelenv.make_env(tmp_path / "env", None)  # the .pth is nowhere in its site
    result = subprocess.run(
        [str(python), "-m", "autograd_guard.cli", "doctor"],
        cwd=tmp_path,
        env=wheelenv.clean_environ(PYTHONPATH=str(target)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert ".pth          MISSING" in result.stdout, result.stdout + result.stderr
    assert "--editable" not in result.stdout
    assert f"imported from {target}, which is not a site-packages folder" in result.stdout
    assert "'autograd-guard run -- CMD ARGS'" in result.stdout


def test_doctor_lines_up_the_modes_after_the_longest_guard_name(capsys):
    """pytorch3d_hard_silhouette is 25 characters: the column is sized from the names."""
    assert cli.main(["doctor"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if " mode=" in line]
    assert len(rows) == len(builtin()) > 1
    longest = max(len(guard.name) for guard in builtin())
    assert {row.index(" mode=") for row in rows} == {2 + longest}


# The line an editable install made before the package's folders kept in site-packages.
OLD_PTH = (
    'import os; os.environ.get("AUTOGRAD_GUARD", "").strip().lower() in ("", "0", "off", '
    '"false", "no") or __import__("autograd_guard._bootstrap")._bootstrap.bootstrap()\n'
)


def test_doctor_names_a_stale_pth(tmp_path, monkeypatch, capsys):
    """An editable install keeps its copy of the .pth across a `git pull`: one that imports
    a module this version lacks is named, with what to do, not called installed."""
    from autograd_guard._cli import doctor

    stale = tmp_path / "autograd_guard.pth"
    stale.write_text(OLD_PTH, encoding="utf-8")
    monkeypatch.setattr(doctor, "find_pth", lambda: str(stale))
    cli.main(["doctor"])
    out = capsys.readouterr().out
    assert f".pth          STALE: {stale} imports autograd_guard._bootstrap" in out
    assert "installed:" not in out and "Setting AUTOGRAD_GUARD does nothing here" in out
    assert doctor.stale_pth(str(ROOT / "autograd_guard.pth")) is None  # the shipped line


def test_doctor_shows_every_problem_check_finds(tmp_path):
    """An unknown guard and a mistyped rule target (its package installed): check names
    both, and so does doctor, through the same code (a child interpreter each)."""
    (tmp_path / "autograd_guard.toml").write_text(
        '[guards.grad_helth]\nmode = "fix"\n\n'
        '[[rules]]\ntarget = "structlog.procesors:render"\naction = "enable_grad"\n'
    )
    said = {}
    for command in ("check", "doctor"):
        result = subprocess.run(
            [sys.executable, "-m", "autograd_guard.cli", command],
            cwd=tmp_path,
            env=wheelenv.clean_environ(PYTHONPATH=str(ROOT)),
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 1, result.stdout + result.stderr
        output = result.stdout + result.stderr
        said[command] = sorted(
            line.split("invalid", 1)[1].split(": ", 1)[1]
            for line in output.splitlines()
            if "invalid" in line
        )
    assert len(said["check"]) == 2 and said["doctor"] == said["check"]
    assert any("did you mean 'grad_health'?" in p for p in said["doctor"])
    assert any("did you mean 'structlog.processors'?" in p for p in said["doctor"])
