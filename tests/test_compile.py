"""Under ``torch.compile`` (inductor and the eager backend) and TorchScript, a remedy
applies as in eager mode, or the guarded call runs eagerly with it (a graph break), or one
event says the guard could not run there. A compile that works unguarded with
``fullgraph=True`` keeps working guarded."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_attached, ipex_standin

import autograd_guard
from autograd_guard._compile import compiled as _compiled
from autograd_guard.testing import capture_events

BACKENDS = ["inductor", "eager"]

STAGES = """
import torch

def stage(x, w):
    return (x * w).sum()

def writes(x):
    x.add_(1)
    return x * 2

def pure(x):
    return x * 2

@torch.jit.ignore
def unscriptable(x):
    return torch.from_numpy(x.numpy() * 2)

class Fitter:
    def run(self, x, w):
        return (x * w).sum()

    def writes(self, x):
        x.add_(1)
        return x * 2
"""


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture
def stages(make_module):
    make_module("compiled_stages", STAGES)
    rules = [
        {"target": "compiled_stages:stage", "action": "enable_grad"},
        {"target": "compiled_stages:writes", "action": "snapshot", "check": "data"},
        {"target": "compiled_stages:pure", "action": "snapshot"},
        {"target": "compiled_stages:unscriptable", "action": "snapshot"},
        {"target": "compiled_stages:Fitter.run", "action": "enable_grad"},
        {"target": "compiled_stages:Fitter.writes", "action": "snapshot", "check": "data"},
    ]
    autograd_guard.install({"rules": rules})
    import compiled_stages

    return compiled_stages


def _hand_written_enable_grad_survives(backend: str, fullgraph: bool) -> bool:
    """Whether a graph entered without grad keeps an ``enable_grad`` written inside it
    (torch < 2.5 compiles such a graph for inference with its AOT backends)."""

    def step(x, w):
        with torch.enable_grad():
            return (x * w).sum()

    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(step, backend=backend, fullgraph=fullgraph)
        survives = compiled(torch.ones(3), torch.ones(3, requires_grad=True)).requires_grad
    torch._dynamo.reset()
    return bool(survives)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("kind", ["function", "method"])
def test_grad_mode_remedy_survives_compile(stages, backend, fullgraph, kind):
    """enable_grad goes into the graph wherever the graph keeps it (the eager backend;
    every backend from torch 2.5); elsewhere the stage runs guarded at a graph break; where
    neither can be (fullgraph), one compiled_unguarded event says so. Never an event that
    says fixed with a result without grad."""
    fitter = stages.Fitter()

    def step(x, w):  # a method is looked up inside the compiled code, as usual
        return stages.stage(x, w) if kind == "function" else fitter.run(x, w)

    line = step.__code__.co_firstlineno + 1
    weights = torch.ones(3, requires_grad=True)
    compiled = torch.compile(step, backend=backend, fullgraph=fullgraph)
    with torch.no_grad(), capture_events() as events:
        loss = compiled(torch.ones(3), weights)
    kept = _hand_written_enable_grad_survives(backend, fullgraph=True)
    forced = fullgraph or (kind == "method" and not _compiled._method_graph_breaks_work())
    if not kept and forced:
        assert [e["action"] for e in events] == ["compiled_unguarded"]
        assert "< 2.5" in events[0]["event"] and not loss.requires_grad  # as unguarded
        return
    assert [(e["action"], e["callsite"]) for e in events] == [("enable_grad", f"{__file__}:{line}")]
    assert loss.requires_grad  # grad was on inside the stage, as in eager mode
    loss.backward()
    assert weights.grad.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stage_that_needs_no_remedy_compiles_with_fullgraph_and_is_silent(stages, backend):
    assert_attached("grad_mode", "compiled_stages:stage")
    assert_attached("snapshot_inputs", "compiled_stages:pure")

    def step(x, w):
        return stages.stage(x, w) + stages.pure(x).sum()

    weights = torch.ones(3, requires_grad=True)
    with capture_events() as events:
        result = torch.compile(step, backend=backend, fullgraph=True)(torch.ones(3), weights)
    assert result.item() == 9.0 and result.requires_grad
    assert [e for e in events if e["action"] != "compiled_unguarded"] == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_snapshot_rule_runs_eagerly_inside_a_compiled_function(stages, backend):
    def step(x):
        return stages.writes(x).sin()

    x = torch.zeros(3)
    with capture_events() as events:
        torch.compile(step, backend=backend)(x)
    assert x.tolist() == [0.0, 0.0, 0.0]  # restored, as in eager mode
    assert [e["action"] for e in events] == ["input_modified"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_snapshot_rule_on_a_method_inside_a_compiled_function(stages, backend):
    fitter = stages.Fitter()

    def step(x):
        return fitter.writes(x).sin()

    x = torch.zeros(3)
    with capture_events() as events:
        out = torch.compile(step, backend=backend)(x)
    assert out.tolist() == torch.ones(3).mul(2).sin().tolist()
    if _compiled._method_graph_breaks_work():
        assert x.tolist() == [0.0, 0.0, 0.0]  # run eagerly, guarded: restored
        assert [e["action"] for e in events] == ["input_modified"]
    else:  # this torch cannot run it guarded inside a graph: said once, left as unguarded
        assert x.tolist() == [1.0, 1.0, 1.0]
        assert [e["action"] for e in events] == ["compiled_unguarded"]


def test_under_fullgraph_a_guard_that_cannot_run_says_so_once(stages):
    def step(x):
        return stages.pure(x).sin()

    compiled = torch.compile(step, backend="eager", fullgraph=True)
    with capture_events() as events:
        compiled(torch.ones(3))
        compiled(torch.ones(3))
    [event] = events
    assert event["action"] == "compiled_unguarded" and event["target"] == "compiled_stages:pure"


@pytest.fixture
def ipex_on_cpu(tmp_path, monkeypatch):
    """The stand-in IPEX distribution of tests/test_ipex.py, affected devices = cpu."""
    from autograd_guard._common import versions as _versions

    site = ipex_standin(tmp_path / "site", "2.1.10+xpu")
    monkeypatch.syspath_prepend(str(site))
    _versions.clear_cache()
    autograd_guard.install({"guards": {"ipex_xpu": {"devices": ["cpu"]}}})
    import intel_extension_for_pytorch  # noqa: F401

    yield
    autograd_guard.uninstall()
    import sys

    sys.modules.pop("intel_extension_for_pytorch", None)
    _versions.clear_cache()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fullgraph", [False, True])
def test_ipex_dropout_remedy_survives_compile(ipex_on_cpu, backend, fullgraph):
    def infer(x):
        return F.dropout(x, p=0.5, training=True) * 1.0

    compiled = torch.compile(infer, backend=backend, fullgraph=fullgraph)
    with torch.no_grad(), capture_events() as events:
        out = compiled(torch.ones(1000))
    assert int((out == 0).sum()) == 0  # eager guarded: no element dropped
    assert [e["action"] for e in events] == ["dropout_identity"]
    with capture_events() as events:
        trained = compiled(torch.ones(1000))  # grad on: training, dropout applies
    assert 300 < int((trained == 0).sum()) < 700 and events == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_ipex_bicubic_remedy_survives_compile(ipex_on_cpu, backend):
    image = torch.rand(1, 3, 8, 8)
    expected = F.interpolate(image, scale_factor=2, mode="bicubic")

    def resize(x):
        return F.interpolate(x, scale_factor=2, mode="bicubic")

    with capture_events() as events:
        out = torch.compile(resize, backend=backend, fullgraph=True)(image)
    torch.testing.assert_close(out, expected)
    # The compiled remedy; with the eager backend the graph also calls F.interpolate by
    # name at run time, where the stand-in device list ("cpu") still matches the copy.
    assert {e["action"] for e in events} == {"bicubic_on_cpu"}
    # the compiled remedy names the user's line that calls the guarded function
    line = resize.__code__.co_firstlineno + 1
    assert f"{__file__}:{line}" in {e["callsite"] for e in events}


def test_torchscript_of_a_guarded_function_says_the_guard_cannot_run(stages):
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return stages.pure(x) + 1

    with capture_events() as events:
        scripted = torch.jit.script(Model())
    assert scripted(torch.ones(2)).tolist() == [3.0, 3.0]
    [event] = events
    assert event["action"] == "scripted_unguarded" and event["target"] == "compiled_stages:pure"


def test_torchscript_keeps_jit_ignore_of_the_original_and_of_the_guarded_function(stages):
    assert hasattr(stages.unscriptable, "__wrapped__")  # really guarded
    assert_attached("snapshot_inputs", "compiled_stages:unscriptable", "compiled_stages:pure")
    torch.jit.ignore(stages.pure)  # ignored after it was guarded: the proxy takes it

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return stages.unscriptable(x) + stages.pure(x)

    with capture_events() as events:
        scripted = torch.jit.script(Model())  # both run in Python, guarded
        assert scripted(torch.ones(2)).tolist() == [4.0, 4.0]
    assert events == []


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("kind", ["function", "method"])
def test_compiling_the_guarded_function_itself(stages, backend, fullgraph, kind):
    """torch.compile(guarded) compiles the original with the guard around it, as a call
    from compiled code does; the guard's own frames are never traced."""
    guarded = stages.stage if kind == "function" else stages.Fitter().run
    compiled = torch.compile(guarded, backend=backend, fullgraph=fullgraph)
    weights = torch.ones(3, requires_grad=True)
    with capture_events() as events:
        assert compiled(torch.ones(3), weights).requires_grad  # correct code: silent
    assert events == []
    with torch.no_grad(), capture_events() as events:
        loss = compiled(torch.ones(3), weights)
    assert [e["action"] for e in events] == ["enable_grad"]
    if loss.requires_grad or _hand_written_enable_grad_survives(backend, fullgraph):
        loss.backward()
        assert weights.grad.tolist() == [1.0, 1.0, 1.0]
