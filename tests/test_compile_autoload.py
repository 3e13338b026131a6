"""torch.compile in programs guarded through the real ``.pth`` auto-load (the built wheel
in a fresh venv): the engine then loads while ``import torch`` is still running, which an
``install()`` after ``import torch`` never shows. Each program runs twice, unguarded and
guarded; guarded, correct code prints what it prints unguarded, and nothing on stderr."""

from __future__ import annotations

import json
import textwrap

import pytest
from helpers import assert_attached, run_python

STAGES = """
import torch

def stage(x, w):
    return (x * w).sum()

class Fitter:
    def run(self, x, w):
        return (x * w).sum()
"""

POLICY = """
mode = "fix"
[[rules]]
target = "compiled_stages:stage"
action = "enable_grad"
[[rules]]
target = "compiled_stages:Fitter.run"
action = "enable_grad"
"""

PROGRAM = """
import json, sys, torch
import compiled_stages

kind, fullgraph, grad = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
fitter = compiled_stages.Fitter()

def step(x, w):
    return compiled_stages.stage(x, w) if kind == "function" else fitter.run(x, w)

compiled = torch.compile(step, backend="eager", fullgraph=fullgraph)
weights = torch.ones(3, requires_grad=True)
with torch.set_grad_enabled(grad):
    try:
        results = [compiled(torch.ones(3), weights) for _ in range(3)]
        print(json.dumps({"value": results[-1].item(), "grad": results[-1].requires_grad}))
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__}))
guard = sys.modules.get("autograd_guard")  # loaded by the .pth in the guarded run only
if guard is not None:
    with open("status.json", "w") as f:
        json.dump(guard.status(), f, default=str)
"""


def _program(*argv: str) -> str:
    return (
        f"import runpy, sys; sys.argv = ['program.py', *{argv!r}]; "
        "runpy.run_path('program.py', run_name='__main__')"
    )


def _twin_runs(python, project, code):
    """``code`` run unguarded, then guarded by the .pth; and the guarded run's events."""
    unguarded = run_python(python, code, project, PYTHONPATH=str(project))
    log = project / "events.jsonl"
    guarded = run_python(
        python, code, project, PYTHONPATH=str(project),
        AUTOGRAD_GUARD="1", AUTOGRAD_GUARD_LOG=str(log),
    )  # fmt: skip
    lines = log.read_text().splitlines() if log.exists() else []
    return unguarded, guarded, [json.loads(line) for line in lines]


@pytest.fixture
def compiled_project(tmp_path):
    (tmp_path / "compiled_stages.py").write_text(STAGES)
    (tmp_path / "autograd_guard.toml").write_text(POLICY)
    (tmp_path / "program.py").write_text(PROGRAM)
    return tmp_path


@pytest.mark.parametrize("kind", ["function", "method"])
@pytest.mark.parametrize("fullgraph", [False, True])
def test_correct_compiled_code_is_unchanged_and_silent(
    guard_python, compiled_project, kind, fullgraph
):
    code = _program(kind, "1" if fullgraph else "0", "1")
    unguarded, guarded, events = _twin_runs(guard_python, compiled_project, code)
    status = json.loads((compiled_project / "status.json").read_text())
    place = "compiled_stages:" + ("stage" if kind == "function" else "Fitter.run")
    assert_attached("grad_mode", place, status=status)
    assert json.loads(unguarded.stdout) == {"value": 3.0, "grad": True}
    assert guarded.stdout == unguarded.stdout
    assert guarded.stderr == unguarded.stderr  # torch's own warnings only, if any
    assert events == []


@pytest.mark.parametrize("kind", ["function", "method"])
def test_a_compiled_stage_entered_without_grad_is_fixed(guard_python, compiled_project, kind):
    unguarded, guarded, events = _twin_runs(
        guard_python, compiled_project, _program(kind, "0", "0")
    )
    assert json.loads(unguarded.stdout) == {"value": 3.0, "grad": False}
    assert json.loads(guarded.stdout) == {"value": 3.0, "grad": True}
    assert "Traceback" not in guarded.stderr
    actions = [e["action"] for e in events]
    assert actions == ["enable_grad", "summary"]  # logged once for the three calls


def test_fullgraph_with_a_guard_that_cannot_run_compiles_and_says_so(guard_python, tmp_path):
    (tmp_path / "compiled_stages.py").write_text("def pure(x):\n    return x * 2\n")
    (tmp_path / "autograd_guard.toml").write_text(
        '[[rules]]\ntarget = "compiled_stages:pure"\naction = "snapshot"\n'
    )
    code = """
    import torch, compiled_stages
    f = torch.compile(lambda x: compiled_stages.pure(x).sin(), backend="eager", fullgraph=True)
    print(f(torch.zeros(2)).tolist(), f(torch.ones(2)).tolist())
    """
    unguarded, guarded, events = _twin_runs(guard_python, tmp_path, textwrap.dedent(code))
    assert guarded.stdout == unguarded.stdout
    assert "Traceback" not in guarded.stderr
    assert [e["action"] for e in events] == ["compiled_unguarded", "summary"]
