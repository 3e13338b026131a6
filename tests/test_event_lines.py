"""Two layers of text on a terminal (issue 52): the first line of every event on stderr is at
most 200 characters and says what happened and where; the rest of what happened, the error,
the remedy and the policy in force follow on indented lines. The ``logging`` sink and the
JSON lines keep every field on one line. Every event kind the code emits is rendered."""

from __future__ import annotations

import ast
import json
import logging
import re

import pytest
from helpers import ROOT, run_python

from autograd_guard._events import actions as _actions
from autograd_guard._events import events as _events
from autograd_guard._events.sinks import FIRST_LINE, INDENT

PACKAGE = ROOT / "autograd_guard"


def event_kinds() -> set[str]:
    """Every action a guard or the engine emits: ``action="..."``, ``report(at, "...", ...)``,
    the compile helpers' third argument, a guard's ``rule_action`` and what ``actions``
    classifies."""
    kinds = set(_actions.NOT_INTERVENTIONS | _actions.FINDINGS)
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                place = {"report": 1, "refuse_in_graph": 2, "cannot_run": 2}.get(name)
                if place is not None and len(node.args) > place:
                    arg = node.args[place]
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        kinds.add(arg.value)
                kinds.update(
                    k.value.value
                    for k in node.keywords
                    if k.arg == "action" and isinstance(k.value, ast.Constant)
                )
            elif isinstance(node, ast.Assign) and any(
                getattr(t, "id", "") == "rule_action" for t in node.targets
            ):
                kinds.add(node.value.value)  # type: ignore[attr-defined]
    return kinds - {"store_true", "append", "version"}  # argparse's, not events


def test_the_kinds_found_include_every_guards():
    kinds = event_kinds()
    assert {"nonfinite_gradient", "nonfinite_loss", "lost_gradient", "enable_grad"} <= kinds
    assert {"redirect", "input_modified", "overwritten", "compiled_unguarded"} <= kinds
    assert len(kinds) >= 40


LONG = (
    "every gradient this optimizer consumed was exactly zero for 20 optimizer steps in a row "
    "(none missing, none non-finite): the loss is not moving the weights (momentum or weight "
    "decay still may); either training reached an exact stationary point, or something cuts "
    "the gradient off, " * 3
)
NO_BREAK = "x" * 500
SITES = ("train.py:12", "/home/someone/" + "very/" * 60 + "deep/train.py:12", "-")


@pytest.mark.parametrize("kind", sorted(event_kinds()))
def test_the_first_line_of_every_kind_is_short_and_says_where(kind, capsys):
    _events.configure("stderr")
    try:
        for text in (LONG, NO_BREAK, "stage entered with grad disabled"):
            for site in SITES:
                _events.reset()
                _events.emit(
                    text,
                    guard="pytorch3d_hard_silhouette",
                    action=kind,
                    callsite=site,
                    rank=7,
                    error="ValueError at autograd_guard/x.py:10",
                    remedy="call the stage inside 'with torch.enable_grad():' " * 4,
                    policy="preset default, no policy file from the working directory up",
                )
                lines = capsys.readouterr().err.splitlines()
                first, rest = lines[0], lines[1:]
                assert len(first) <= FIRST_LINE, first
                assert first.startswith(
                    f"autograd-guard warning (rank 7): [pytorch3d_hard_silhouette/{kind}] "
                )
                if site != "-":
                    assert first.endswith(site[-20:])
                assert all(line.startswith(INDENT) for line in rest)
                said = " ".join(line.strip() for line in [first, *rest])
                assert "remedy: call the stage" in said and "policy: preset default" in said
                assert "error: ValueError" in said
                words = text.split()
                assert words[-1].strip(",") in said or text == NO_BREAK
    finally:
        _events.configure(None)
        _events.reset()


def test_logging_and_json_keep_every_field_on_one_line(tmp_path, caplog):
    log = tmp_path / "events.jsonl"
    fields = {"guard": "grad_health", "action": "zero_gradient", "callsite": "t.py:3"}
    for destination in ("logging", str(log)):
        _events.configure(destination)
        try:
            with caplog.at_level(logging.DEBUG, logger="autograd_guard"):
                _events.emit(LONG, remedy="do this", parameters=["w"], **fields)
        finally:
            _events.configure(None)
            _events.reset()
    [message] = [r.getMessage() for r in caplog.records]
    assert "\n" not in message and LONG.strip() in message and "remedy: do this" in message
    record = json.loads(log.read_text())
    assert record["event"] == LONG and record["remedy"] == "do this"
    assert record["parameters"] == ["w"]


PROGRAMS = {
    "nan_gradient": (ROOT / "examples" / "nan_gradient.py").read_text(),
    "detached_layer": (ROOT / "examples" / "detached_layer.py").read_text(),
    "nonfinite_loss": """
import torch
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(30):
    optimizer.zero_grad()
    torch.log(torch.relu(model(torch.randn(8, 3)) * 0)).mean().backward()
    optimizer.step()
""",
}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_real_runs_print_short_first_lines(guard_python, tmp_path, program):
    deep = tmp_path / "a_rather_long_folder_name_for_a_project" / "and_its_training_code"
    deep.mkdir(parents=True)
    result = run_python(guard_python, PROGRAMS[program], deep, AUTOGRAD_GUARD="1")
    lines = result.stderr.splitlines()
    firsts = [line for line in lines if line.startswith("autograd-guard ")]
    assert len(firsts) >= 2, result.stderr
    assert all(len(line) <= FIRST_LINE for line in firsts), result.stderr
    assert all(line.startswith(("autograd-guard ", INDENT)) for line in lines), result.stderr
    assert re.search(r"\] .* at .*<string>:\d+$", firsts[0]), firsts[0]
    assert any(line.startswith(f"{INDENT}remedy: ") for line in lines)
