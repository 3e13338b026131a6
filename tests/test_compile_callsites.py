"""A guarded call reached from code torch generated names the user's line: a ``torch.fx``
graph's ``forward`` (``<eval_with_key>.N``) under ``allow_in_graph``, an aot backend, a
backend returning ``gm.forward`` or ``torch.fx.symbolic_trace``; and a graph break in a
function whose rewritten code lost its lines (torch 2.6 on CPython 3.12 puts every
instruction on the ``def`` line, or inside a ``with`` block on lines of torch's own)."""

from __future__ import annotations

import pytest
import torch

import autograd_guard
from autograd_guard.testing import capture_events

STAGES = """
import torch

def stage(x, w):
    return (x * w).sum()
"""

TRACED = """
import torch
from fx_stages import stage

torch.fx.wrap("stage")

class Net(torch.nn.Module):
    def forward(self, x, w):
        return stage(x, w) * 2
"""


@pytest.fixture
def stages(make_module):
    make_module("fx_stages", STAGES)
    make_module("fx_traced", TRACED)
    torch._dynamo.reset()
    autograd_guard.install(
        {"mode": "fix", "rules": [{"target": "fx_stages:stage", "action": "enable_grad"}]}
    )
    import fx_stages

    yield fx_stages
    torch._dynamo.reset()


def line_of(marker: str) -> str:
    """``file:line`` of the line of this file that ends with ``# <marker>``."""
    with open(__file__) as source:
        for number, text in enumerate(source, 1):
            if text.rstrip().endswith(f"# {marker}"):
                return f"{__file__}:{number}"
    raise AssertionError(marker)


def sites(events: list[dict]) -> set[str]:
    assert events and all(e["action"] == "enable_grad" for e in events)
    return {e["callsite"] for e in events}


def graph_forward(graph, inputs):
    return graph.forward


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "graph_forward"])
def test_a_call_allowed_in_graph_names_the_line_of_the_call(stages, backend):
    allowed = torch._dynamo.allow_in_graph(stages.stage)
    w = torch.ones(3, requires_grad=True)

    def step(x):
        y = x + 1
        return allowed(y, w) * 2  # call: allowed

    chosen = graph_forward if backend == "graph_forward" else backend
    with capture_events() as events, torch.no_grad():
        torch.compile(step, backend=chosen)(torch.ones(3))
    assert all("<" not in site for site in sites(events))
    assert sites(events) == {line_of("call: allowed")}


def test_a_graph_break_under_a_backend_returning_forward_names_the_line(stages):
    w = torch.ones(3, requires_grad=True)

    def step(x):
        y = x + 1
        return stages.stage(y, w) * 2  # call: breaks

    with capture_events() as events, torch.no_grad():
        torch.compile(step, backend=graph_forward)(torch.ones(3))
    assert sites(events) == {line_of("call: breaks")}


def test_calls_at_two_graph_breaks_name_their_lines(stages):
    w = torch.ones(3, requires_grad=True)

    def step(x):
        y = stages.stage(x + 1, w)  # call: first break
        y = y * 3
        return stages.stage(y, w) * 2  # call: second break, in the resume function

    with capture_events() as events, torch.no_grad():
        torch.compile(step, backend="eager")(torch.ones(3))
    assert sites(events) == {
        line_of("call: first break"),
        line_of("call: second break, in the resume function"),
    }


def test_a_graph_break_on_a_function_found_by_getattr_names_the_line(stages):
    w, name = torch.ones(3, requires_grad=True), "stage"

    def step(x):
        y = x + 1
        return getattr(stages, name)(y, w)  # call: getattr

    with capture_events() as events, torch.no_grad():
        assert torch.compile(step, backend="eager")(torch.ones(3)).requires_grad
    assert sites(events) == {line_of("call: getattr")}


def test_a_symbolically_traced_module_names_the_line_that_runs_it(stages):
    import fx_traced

    graph = torch.fx.symbolic_trace(fx_traced.Net())
    assert "<eval_with_key>" in graph.forward.__code__.co_filename
    with capture_events() as events, torch.no_grad():
        graph(torch.ones(3), torch.ones(3, requires_grad=True))  # call: traced module
    assert sites(events) == {line_of("call: traced module")}


def test_a_graph_called_by_hand_names_the_line_that_calls_it(stages):
    import fx_traced

    graph = torch.fx.symbolic_trace(fx_traced.Net())
    with capture_events() as events, torch.no_grad():
        graph.forward(torch.ones(3), torch.ones(3, requires_grad=True))  # call: by hand
    assert sites(events) == {line_of("call: by hand")}


@pytest.mark.parametrize("mode", ["strict", "fix"])
def test_a_call_inside_no_grad_in_a_compiled_function_names_its_line(stages, mode):
    """torch 2.6 on CPython 3.12 rewrites a ``with`` block around a graph break from a
    template of its own: its lines (148-152 of torch's resume_execution.py) stood for the
    user's, so strict, which runs the stage outside the graph, named line 150 of this file."""
    autograd_guard.install(
        {"mode": mode, "rules": [{"target": "fx_stages:stage", "action": "enable_grad"}]}
    )
    w = torch.ones(3, requires_grad=True)

    def step(x):
        with torch.no_grad():
            y = stages.stage(x, w)  # call: inside no_grad
        return y * 3

    def resumed(x):
        with torch.no_grad():
            torch._dynamo.graph_break()
            y = stages.stage(x, w)  # call: inside no_grad, in the resume function
        return y * 3

    for fn, marker in [
        (step, "call: inside no_grad"),
        (resumed, "call: inside no_grad, in the resume function"),
    ]:
        torch._dynamo.reset()
        raised = False
        with capture_events() as events:
            try:
                torch.compile(fn, backend="eager")(torch.ones(3))
            except autograd_guard.GuardError:
                raised = True
        assert raised == (mode == "strict")
        assert sites(events) == {line_of(marker)}
