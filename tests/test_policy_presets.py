"""The shipped presets: ``default`` carries no example's rules (``check`` in any project
named Unique3D's absent modules twice), ``unique3d`` does, and examples/ uses it."""

from __future__ import annotations

import subprocess
import sys

import wheelenv
from helpers import ROOT

from autograd_guard import cli


def test_check_in_a_project_without_a_policy_has_nothing_to_say(tmp_path, capsys):
    assert cli.main(["check"]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == ("ok: preset default (mode fix, 0 rules)\n", "")


def test_the_unique3d_preset_keeps_its_notes_where_its_modules_are_absent(capsys):
    assert cli.main(["check", "unique3d"]) == 0
    notes = capsys.readouterr().out.splitlines()[:2]
    assert all(n.startswith("note: preset unique3d: rules[") for n in notes), notes


def test_the_main_job_of_the_readme_is_guarded_by_the_examples_policy(tmp_path):
    examples = ROOT / "examples"
    assert (examples / "autograd_guard.toml").read_text().count('extends = "unique3d"') == 1
    run = subprocess.run(
        [sys.executable, "unique3d_app.py"],
        cwd=examples,
        env=wheelenv.clean_environ(AUTOGRAD_GUARD="1", XDG_CACHE_HOME=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("stage 1 done: mean vertex error 0.0")
    assert "[grad_mode/enable_grad] stage entered with grad disabled" in run.stderr
