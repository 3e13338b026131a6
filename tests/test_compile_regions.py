"""A guarded call that a torch.compile region runs eagerly (``torch.compile(model)`` reaching
``forward`` through ``nn.Module.__call__``, which Dynamo skips; a generator stage; a frame
Dynamo gave up on) has none of the guard's frames compiled: the guard runs beside the
graph and the original compiles as it does unguarded. Static and class methods are guarded
inside compiled code as functions and methods are."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_attached

import autograd_guard
from autograd_guard._compile import dynamo_frames as _dynamo_frames
from autograd_guard.testing import capture_events

STAGES = """
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.lin(x).tanh()

class Stage:
    scale = 2.0

    @staticmethod
    def solve(x, w):
        return (x * w).sum()

    @classmethod
    def score(cls, x, w):
        return (x * w * cls.scale).sum()

def halves(x):
    yield x * 0.5
    yield x * 0.25
"""

RULES = [
    {"target": "region_stages:Net.forward", "action": "enable_grad"},
    {"target": "region_stages:Stage.solve", "action": "enable_grad"},
    {"target": "region_stages:Stage.score", "action": "enable_grad"},
    {"target": "region_stages:halves", "action": "enable_grad"},
]


@pytest.fixture
def stages(make_module):
    make_module("region_stages", STAGES)
    torch._dynamo.reset()
    autograd_guard.install({"rules": RULES})
    import region_stages

    assert hasattr(region_stages.Net.forward, "_self_wrapper")
    assert hasattr(region_stages.Stage.__dict__["solve"].__func__, "_self_wrapper")
    assert hasattr(region_stages.Stage.__dict__["score"].__func__, "_self_wrapper")
    yield region_stages
    torch._dynamo.reset()


class GraphCount:
    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, graph, inputs):
        self.graphs += 1
        return graph.forward


def frames_compiled() -> int:
    return int(torch._dynamo.utils.counters["frames"]["total"])


def test_a_model_compiled_with_fullgraph_whose_forward_is_guarded(stages):
    net, backend = stages.Net(), GraphCount()
    compiled = torch.compile(net, fullgraph=True, backend=backend)
    x = torch.randn(3, 4)
    with capture_events() as events:
        with_grad = compiled(x)
        with torch.no_grad():
            without_grad = compiled(x)
    assert backend.graphs == 1  # forward, compiled as unguarded
    assert with_grad.requires_grad and without_grad.requires_grad
    torch.testing.assert_close(with_grad, net(x), rtol=0, atol=0)
    assert [e["action"] for e in events] == ["enable_grad"]


def test_a_model_compiled_with_a_guarded_forward_and_grad_on_says_nothing(stages):
    assert_attached("grad_mode", "region_stages:Net.forward")
    net = stages.Net()
    with capture_events() as events:
        out = torch.compile(net, fullgraph=True, backend="eager")(torch.randn(3, 4))
    out.sum().backward()
    assert net.lin.weight.grad is not None
    assert events == []


def test_a_generator_stage_in_compiled_code_compiles_no_guard_frame(stages):
    x = torch.randn(3, requires_grad=True)

    def total(x):
        return list(stages.halves(x))

    before = frames_compiled()
    with capture_events() as events, torch.no_grad():
        parts = torch.compile(total, backend="eager")(x)
    assert all(p.requires_grad for p in parts)
    assert [e["action"] for e in events] == ["enable_grad"]
    # before the guard's frames were skipped, ~300 frames of its own were compiled here
    assert frames_compiled() - before <= 6


def test_a_generator_stage_entered_with_grad_compiles_as_unguarded(stages):
    """Correct code: the generator is traced into the graph as unguarded, silently."""

    def total(x):
        return sum(stages.halves(x.sin())).cos()

    x = torch.randn(3, requires_grad=True)
    unguarded = GraphCount()
    autograd_guard.uninstall()
    torch.compile(total, backend=unguarded)(x)
    torch._dynamo.reset()
    autograd_guard.install({"rules": RULES})
    guarded = GraphCount()
    with capture_events() as events:
        out = torch.compile(total, backend=guarded)(x)
    assert out.requires_grad and events == []
    assert guarded.graphs == unguarded.graphs == 1


@pytest.mark.parametrize("mode", ["fix", "strict"])
def test_a_generator_stage_entered_with_grad_off_under_fullgraph_is_said(stages, mode):
    """No graph can give grad to a generator's resumes: one compiled_unguarded event,
    and no fix claimed; strict raises in the user's call."""
    autograd_guard.install({"mode": mode, "rules": RULES})
    compiled = torch.compile(lambda x: list(stages.halves(x)), backend="eager", fullgraph=True)
    x = torch.randn(3, requires_grad=True)
    with capture_events() as events, torch.no_grad():
        if mode == "strict":
            with pytest.raises(autograd_guard.GuardError, match="grad needed"):
                compiled(x)
        else:
            assert not any(p.requires_grad for p in compiled(x))  # as unguarded
    expected = "enable_grad" if mode == "strict" else "compiled_unguarded"
    assert [e["action"] for e in events] == [expected]
    if mode == "fix":
        assert "generator" in events[0]["event"]


@pytest.mark.parametrize("name", ["solve", "score"])
def test_static_and_class_methods_are_guarded_in_compiled_code(stages, name):
    w = torch.ones(3, requires_grad=True)

    def step(x):
        return getattr(stages.Stage, name)(x, w)

    compiled = torch.compile(step, backend="eager")
    with capture_events() as events, torch.no_grad():
        results = [compiled(torch.arange(3.0) + i) for i in range(4)]
        compiled_after = frames_compiled()
        compiled(torch.arange(3.0))
    assert frames_compiled() == compiled_after  # no recompile on a later call
    if name == "score" and not _dynamo_frames.DYNAMO.classmethod_inline_works:
        # torch 2.15: traced as the original (unguarded in the graph), never a crash
        assert not any(r.requires_grad for r in results) and events == []
        return
    assert all(r.requires_grad for r in results)
    assert [e["action"] for e in events] == ["enable_grad"]


@pytest.mark.parametrize("name", ["solve", "score"])
def test_static_and_class_methods_keep_their_descriptor_kind(stages, name):
    original = {"solve": staticmethod, "score": classmethod}[name]
    assert type(stages.Stage.__dict__[name]) is original
    instance = stages.Stage()
    x, w = torch.arange(3.0), torch.ones(3)
    assert getattr(instance, name)(x, w) == getattr(stages.Stage, name)(x, w)
    autograd_guard.uninstall()
    assert not hasattr(stages.Stage.__dict__[name].__func__, "_self_wrapper")


def test_uninstall_takes_the_remedy_out_of_compiled_code(stages):
    w, solve = torch.ones(3, requires_grad=True), stages.Stage.solve  # kept: no recompile

    def step(x):
        return solve(x, w)

    compiled = torch.compile(step, backend="eager", fullgraph=True)  # the traced remedy
    with torch.no_grad():
        assert compiled(torch.arange(3.0)).requires_grad
        autograd_guard.uninstall()
        with capture_events() as events:
            assert not compiled(torch.arange(3.0)).requires_grad  # recompiled, unguarded
    assert events == []


def test_scripting_a_module_whose_forward_is_guarded_says_it_is_unguarded(stages):
    net = stages.Net()
    assert net.forward.__func__ is stages.Net.__dict__["forward"]  # as a bound method's
    with capture_events() as events:
        scripted = torch.jit.script(net)
    x = torch.randn(3, 4)
    torch.testing.assert_close(scripted(x), net(x), rtol=0, atol=0)
    assert [e["action"] for e in events] == ["scripted_unguarded"]


def test_a_subclass_of_classmethod_is_guarded_as_itself(make_module):
    make_module(
        "registered_stages",
        """
        import torch

        class registered(classmethod):  # state of its own, set when the class is made
            def __set_name__(self, owner, name):
                self.owner = owner.__name__

        class Model:
            @registered
            def build(cls, w):
                return cls.__name__, (w * 2).sum()
        """,
    )
    autograd_guard.install(
        {"rules": [{"target": "registered_stages:Model.build", "action": "enable_grad"}]}
    )
    import registered_stages

    descriptor = registered_stages.Model.__dict__["build"]
    assert descriptor.owner == "Model"  # the user's object, wrapped as itself
    with capture_events() as events, torch.no_grad():
        name, total = registered_stages.Model.build(torch.ones(2, requires_grad=True))
    assert name == "Model" and total.requires_grad
    assert [e["action"] for e in events] == ["enable_grad"]


def test_a_lean_disabled_function_breaks_the_graph_and_runs_outside_dynamo():
    """``dynamo_frames.disabled``, the gate's per-step form of ``torch._dynamo.disable``:
    a compiled function that calls it breaks its graph there and runs it once, eagerly,
    with Dynamo's callback unset (none of its frames compiled); the code either side is
    compiled as before."""
    import torch._dynamo

    _dynamo_frames.dynamo_imported(torch._dynamo)
    set_eval_frame = _dynamo_frames.DYNAMO.set_eval_frame
    callbacks = []

    def check(x):
        callback = set_eval_frame(None)  # what runs this frame
        set_eval_frame(callback)
        callbacks.append(callback)
        return x + 1

    lean = _dynamo_frames.disabled(check)
    graphs = []

    def backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    @torch.compile(backend=backend)
    def step(x):
        return lean(x * 2) * 3

    assert torch.equal(step(torch.ones(2)), torch.full((2,), 9.0))
    assert callbacks == [None]
    assert len(graphs) == 2  # x * 2, then * 3: the call between them ran eagerly
    assert lean(torch.zeros(1)).item() == 1.0 and callbacks[-1] is None  # eager: as before
