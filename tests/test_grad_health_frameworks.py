"""grad_health under training frameworks, in-process: the twin corpus's Accelerate and
Lightning programs (``twins/cases``), run through the guard in fix mode, and the call site
each ``nonfinite_gradient`` event names. The framework calls the optimizer from a line of its
own (accelerate's ``AcceleratedOptimizer.step``, Lightning's precision plugin, the same line
for every optimizer); the event must name the program's line instead, one per optimizer.

The twin corpus compares these programs' outcomes with their hand fixes and checks that a
call site lies in the program's folder; this checks which line it is."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import thirdparty
from helpers import assert_attached

import autograd_guard
from autograd_guard.testing import capture_events

CASES = Path(__file__).resolve().parent / "twins" / "cases"
CALLSITE = re.compile(r"^(?P<file>.+\.py):(?P<line>\d+)")


@pytest.fixture
def load_case(monkeypatch: pytest.MonkeyPatch):
    """Import a twin case from its file, its library's folder on sys.path; the process's
    environment is put back afterwards (Accelerate writes into it)."""
    environ = dict(os.environ)
    monkeypatch.delenv("TWIN_HANDFIX", raising=False)

    def load(name: str, library: str) -> tuple[ModuleType, Path]:
        folder = thirdparty.install(library)
        monkeypatch.syspath_prepend(str(folder))
        spec = importlib.util.spec_from_file_location(f"twin_case_{name}", CASES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module, folder

    yield load
    os.environ.clear()
    os.environ.update(environ)


def nonfinite_events(case: ModuleType) -> list[dict[str, Any]]:
    """``case.main()`` guarded in fix mode; the ``nonfinite_gradient`` events it logged."""
    autograd_guard.install({"mode": "fix"})
    try:
        assert_attached("grad_health", "torch.optim.optimizer")
        with capture_events() as events:
            case.main()
    finally:
        autograd_guard.uninstall()
    return [e for e in events if e["action"] == "nonfinite_gradient"]


def where(event: dict[str, Any]) -> tuple[Path, int]:
    match = CALLSITE.match(str(event["callsite"]))
    assert match, event
    return Path(match["file"]).resolve(), int(match["line"])


def line_of(case: ModuleType, text: str) -> int:
    """The one line of the case's source that starts with ``text`` (indentation aside)."""
    lines = Path(case.__file__).read_text().splitlines()
    found = [number for number, line in enumerate(lines, 1) if line.strip().startswith(text)]
    assert len(found) == 1, (text, found)
    return found[0]


def assert_in_program(event: dict[str, Any], case: ModuleType, library: Path) -> int:
    file, line = where(event)
    assert not file.is_relative_to(library.resolve()), event["callsite"]
    assert file == Path(case.__file__).resolve(), event["callsite"]
    return line


def test_accelerate_names_the_programs_step(load_case, capsys) -> None:
    case, library = load_case("grad_health_accelerate_loop", "accelerate")
    try:
        events = nonfinite_events(case)
    finally:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    assert "weights finite: True" in capsys.readouterr().out
    assert len(events) == 1, events
    assert assert_in_program(events[0], case, library) == line_of(case, "optimizer.step()")


def test_lightning_two_optimizers_are_two_call_sites(load_case, capsys) -> None:
    """Adam and SGD both step from the same line of Lightning's precision plugin: two
    events, each at its own ``opt.step()`` line of the LightningModule."""
    case, library = load_case("grad_health_lightning_loop", "lightning")
    events = nonfinite_events(case)
    assert "weights finite: True" in capsys.readouterr().out
    by_optimizer = {e["optimizer"]: e for e in events}
    assert len(events) == 2 and set(by_optimizer) == {"Adam", "SGD"}, events
    adam = assert_in_program(by_optimizer["Adam"], case, library)
    sgd = assert_in_program(by_optimizer["SGD"], case, library)
    assert adam != sgd
    assert (adam, sgd) == (line_of(case, "opt_a.step()"), line_of(case, "opt_b.step()"))


def test_lightning_automatic_names_the_programs_fit(load_case, capsys) -> None:
    """In automatic optimisation no line of the program calls ``step``: the event names the
    ``trainer.fit`` that runs it, not Lightning's loop."""
    case, library = load_case("grad_health_lightning_automatic", "lightning")
    events = nonfinite_events(case)
    assert "weights finite: True" in capsys.readouterr().out
    assert len(events) == 1, events
    assert assert_in_program(events[0], case, library) == line_of(case, "trainer.fit(")
