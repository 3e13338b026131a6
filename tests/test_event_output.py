"""What a user sees of events (issue 21): one short line per event on stderr, the details
in the JSON log; at exit, once, the rules that never attached; findings counted apart."""

from __future__ import annotations

import json
import os
import sys
import types

from helpers import ROOT, run_python

from autograd_guard._events import actions as _actions
from autograd_guard._events import events as _events

FIELDS = {
    "mode": "fix",
    "target": "fitlib.train:fit",
    "version": None,
    "remedy": "call the stage inside 'with torch.enable_grad():'",
}


def test_stderr_shows_one_short_line_per_event(capsys, tmp_path):
    for destination in ("stderr", str(tmp_path / "events.jsonl")):
        _events.configure(destination)
        try:
            _events.emit(
                "stage entered with grad disabled",
                guard="grad_mode",
                action="enable_grad",
                callsite="train.py:12",
                **FIELDS,
            )
        finally:
            _events.configure(None)
            _events.reset()
    assert capsys.readouterr().err == (
        "autograd-guard warning: [grad_mode/enable_grad] stage entered with grad disabled at "
        "train.py:12\n    remedy: call the stage inside 'with torch.enable_grad():'\n"
    )
    record = json.loads((tmp_path / "events.jsonl").read_text())
    assert record["pid"] and record["process"] and record["target"] == "fitlib.train:fit"


def test_summary_counts_findings_apart():
    rows = [
        {"guard": "grad_mode", "action": "enable_grad", "callsite": "a:1", "count": 2},
        {"guard": "grad_health", "action": "lost_gradient", "callsite": "b:1", "count": 1},
        {"guard": "grad_health", "action": "nonfinite_origin", "callsite": "b:2", "count": 1},
    ]
    assert _actions.describe_counts(rows) == "2 interventions at 1 call site; 2 findings"


PROGRAM = """
import autograd_guard
{torch}
autograd_guard.install()
import fitlib.train
fitlib.train.fit()
"""


def test_rules_that_never_attached_are_named_once_at_exit(tmp_path):
    package = tmp_path / "fitlib"
    package.mkdir()
    (package / "__init__.py").touch()
    (package / "train.py").write_text("def fit():\n    return 1\n")
    policy = tmp_path / "autograd_guard.toml"
    policy.write_text(
        '[[rules]]\ntarget = "fitlib.trian:fit"\naction = "enable_grad"\n'
        '[[rules]]\ntarget = "fitlib.train:fit"\naction = "enable_grad"\n'
        '[[rules]]\ntarget = "fitlib.kernels:splat"\naction = "snapshot"\n'
    )
    path = f"{ROOT}:{tmp_path}"
    result = run_python(
        sys.executable, PROGRAM.format(torch="import torch"), tmp_path, PYTHONPATH=path
    )
    lines = result.stderr.splitlines()
    head, _, at = lines[0].rpartition(" at ")
    # the first line keeps to 200 characters: what fits on it depends on the path's length
    # (a long path is shortened at its start), so the words are checked, not their layout
    assert len(lines[0]) <= 200 and (at == str(policy) or str(policy).endswith(at[3:]))
    said = " ".join([head, *(line.strip() for line in lines[1:3])])
    assert said.startswith(
        "autograd-guard warning: [autograd_guard/unattached_rules] rules never attached "
        "(their module was never imported)"
    )
    for words in (
        f"fitlib.trian:fit ({policy}: rules[0]), fitlib.kernels:splat ({policy}: rules[2])",
        "remedy: check each rule's module path ('autograd-guard check' resolves it); a stage "
        "this program never runs needs no rule",
    ):
        assert words in said, said
    assert "fitlib.train:fit" not in said  # the rule that attached
    assert lines[1].startswith("    ") and lines[2].startswith("    remedy: ")
    assert lines[3:] == [
        "autograd-guard info: [autograd_guard/summary] summary: 0 interventions at 0 call "
        "sites; 1 finding"
    ]
    # A process that never imports torch runs no pipeline: nothing to say.
    plain = run_python(sys.executable, PROGRAM.format(torch=""), tmp_path, PYTHONPATH=path)
    assert plain.stderr == ""


def test_inductors_cpu_probe_process_names_no_unattached_rule(tmp_path):
    # inductor runs `python -c` on this snippet (with the program's environment) to probe
    # the CPU: a process of torch's, which never imports the program's stages.
    (tmp_path / "autograd_guard.toml").write_text(
        '[[rules]]\ntarget = "fitlib.train:fit"\naction = "enable_grad"\n'
    )
    probe = 'import sys\nimport torch\nfrom ctypes import cdll\ncdll.LoadLibrary("libc.so.6")\n'
    environ = {"PYTHONPATH": str(ROOT), "AUTOGRAD_GUARD": "1"}
    assert run_python(sys.executable, probe, tmp_path, **environ).stderr == ""
    # the same rule in a program of the user's own is named
    program = run_python(sys.executable, "import torch\n", tmp_path, **environ)
    assert "unattached_rules" in program.stderr


def test_a_script_inside_torch_is_torchs_process_also_at_exit(monkeypatch):
    # inductor's compile worker runs torch/_inductor/compile_worker/__main__.py; at exit,
    # CPython has deleted __main__.__file__, so the script is known by argv alone.
    import torch

    from autograd_guard._engine import unattached as _unattached

    worker = os.path.join(os.path.dirname(torch.__file__), "_inductor", "worker.py")
    monkeypatch.setattr(sys, "argv", [worker, "--workers=2"])
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    assert _unattached._a_library_process()
    monkeypatch.setattr(sys, "argv", ["/home/user/train.py"])
    assert not _unattached._a_library_process()
