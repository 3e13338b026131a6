"""A guarded method behaves like the original wherever users put it: as a value, in a
``partial``, in a list of callbacks, through ``weakref.WeakMethod``, ``inspect``, ``pickle``
and ``copy``; inside ``torch.compile`` too, with as many graphs as unguarded. And
``strict`` raises ``GuardError`` in the user's call wherever a compiled graph cannot hold
the remedy."""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import pickle
import types
import weakref

import pytest
import torch

import autograd_guard
from autograd_guard.errors import GuardError
from autograd_guard.testing import capture_events

MODULE = """
import torch

class Fitter:
    def __init__(self):
        self.w = torch.ones(3, requires_grad=True)

    def fit(self, x):
        return (x * self.w).sum()

def pure(x):
    return x * 2

def stage(x, w):
    return (x * w).sum()
"""

RULES = [
    {"target": "value_stages:Fitter.fit", "action": "enable_grad"},
    {"target": "value_stages:pure", "action": "snapshot", "check": "data"},
    {"target": "value_stages:stage", "action": "enable_grad"},
]


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.fixture
def module(make_module):
    return importlib.import_module(make_module("value_stages", MODULE))


def _install(mode: str = "fix") -> None:
    autograd_guard.install({"mode": mode, "rules": RULES})


HOLDERS = {
    "bound method": lambda fitter: (lambda run: lambda x: run(x))(fitter.fit),
    "partial": lambda fitter: (lambda run: lambda x: run(x))(functools.partial(fitter.fit)),
    "callback list": lambda fitter: (lambda runs: lambda x: runs[0](x))([fitter.fit]),
    "attribute": lambda fitter: lambda x: fitter.fit(x),
    # a guarded function, held the same ways (the module is the fitter's)
    "function value": lambda fitter: (lambda run: lambda x: run(x, fitter.w))(_stage()),
    "function partial": lambda fitter: (lambda run: lambda x: run(x))(
        functools.partial(_stage(), w=fitter.w)
    ),
    "function in a list": lambda fitter: (lambda runs: lambda x: runs[0](x, fitter.w))([_stage()]),
}


def _stage():
    import value_stages

    return value_stages.stage


def _compile_and_count(function, fullgraph: bool, grad: bool = False):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    try:
        with torch.set_grad_enabled(grad):
            out = torch.compile(function, backend=backend, fullgraph=fullgraph)(torch.arange(3.0))
    except Exception as exc:  # what this torch's Dynamo cannot trace, unguarded too
        out = exc
    torch._dynamo.reset()
    return out, len(graphs)


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("holder", sorted(HOLDERS))
def test_a_guarded_method_held_as_a_value_compiles_as_unguarded(module, holder, fullgraph):
    """The same graph count as unguarded; the remedy holds where the graph keeps it, and
    no event claims a fix the result lacks."""
    plain_out, plain_graphs = _compile_and_count(HOLDERS[holder](module.Fitter()), fullgraph)
    _install()
    with capture_events() as events:
        out, graphs = _compile_and_count(HOLDERS[holder](module.Fitter()), fullgraph)
    if isinstance(plain_out, Exception):  # torch 2.1 traces no bound method held as a value
        assert type(out) is type(plain_out) and str(out) == str(plain_out)
        return
    assert out.item() == plain_out.item() == 3.0
    actions = [e["action"] for e in events]
    if actions == ["compiled_unguarded"]:  # torch < 2.5 with fullgraph: said, not fixed
        assert not out.requires_grad and graphs == plain_graphs
        return
    assert actions == ["enable_grad"] and out.requires_grad and not plain_out.requires_grad
    if "entered with grad disabled; grad re-enabled in the graph" in events[0]["event"]:
        assert graphs == plain_graphs  # the remedy needed no graph break
    else:  # torch < 2.5: the stage ran eagerly at a graph break
        assert not fullgraph


def test_a_guarded_method_is_a_real_bound_method(module):
    _install()
    fitter = module.Fitter()
    method = fitter.fit
    assert type(method) is types.MethodType and inspect.ismethod(method)
    assert method.__func__ is vars(module.Fitter)["fit"] and method.__self__ is fitter
    assert method == fitter.fit and hash(method) == hash(fitter.fit)
    assert str(inspect.signature(method)) == "(x)"
    weak = weakref.WeakMethod(method)
    with torch.no_grad(), capture_events() as events:
        assert weak()(torch.ones(3)).requires_grad  # guarded through the WeakMethod
    assert [e["action"] for e in events] == ["enable_grad"]
    copied = copy.deepcopy(method)
    assert type(copied) is types.MethodType and copied.__self__ is not fitter
    assert copied.__func__ is method.__func__
    loaded = pickle.loads(pickle.dumps(method))
    assert loaded.__func__ is method.__func__ and isinstance(loaded.__self__, module.Fitter)
    del fitter, method, copied
    assert weak() is None  # the guard keeps no instance alive


def test_a_call_through_the_class_hands_the_guard_the_instance(module):
    seen = []

    class Seen(autograd_guard.guard.Guard):
        name = "seen_instance"
        targets = (autograd_guard.guard.Target("value_stages", "Fitter.fit"),)

        def handle(self, call):
            seen.append((call.instance, len(call.args)))
            return call.proceed()

    from autograd_guard import guards

    guards.register(Seen)
    autograd_guard.install({})
    fitter = module.Fitter()
    fitter.fit(torch.ones(3))
    module.Fitter.fit(fitter, torch.ones(3))
    weakref.WeakMethod(fitter.fit)()(torch.ones(3))
    assert seen == [(fitter, 1)] * 3
    with pytest.raises(TypeError, match="missing"):
        module.Fitter.fit()  # as unguarded


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_strict_raises_in_the_users_call_under_fullgraph(module, backend):
    _install("strict")
    fitter = module.Fitter()
    compiled = torch.compile(lambda x: fitter.fit(x), backend=backend, fullgraph=True)
    with capture_events() as events:
        assert compiled(torch.ones(3)).requires_grad  # grad on: correct code, silent
        torch._dynamo.reset()
        with torch.no_grad(), pytest.raises(GuardError, match="grad disabled; grad needed"):
            compiled(torch.ones(3))
    assert [(e["action"], e["level"]) for e in events] == [("enable_grad", "error")]
    assert events[0]["callsite"] == f"{__file__}:{_line_of(compiled)}"


def test_strict_raises_where_a_guard_cannot_run_inside_a_graph(module):
    """snapshot_inputs has no remedy a graph can hold: under fullgraph, strict's error."""
    _install("strict")
    compiled = torch.compile(lambda x: module.pure(x), backend="eager", fullgraph=True)
    with capture_events() as events, pytest.raises(GuardError, match="not guarded"):
        compiled(torch.ones(3))
    assert [e["action"] for e in events] == ["compiled_unguarded"]


def test_observe_under_fullgraph_says_needed_and_changes_nothing(module):
    _install("observe")
    fitter = module.Fitter()
    with torch.no_grad(), capture_events() as events:
        out = torch.compile(lambda x: fitter.fit(x), backend="eager", fullgraph=True)(torch.ones(3))
    assert not out.requires_grad  # as unguarded
    assert [e["action"] for e in events] == ["enable_grad"]
    assert "grad needed" in events[0]["event"]


def _line_of(compiled) -> int:
    """The line of the lambda compiled in the calling test."""
    return compiled._torchdynamo_orig_callable.__code__.co_firstlineno


@pytest.mark.parametrize("kind", ["function", "method"])
def test_a_graph_break_after_a_guarded_call_compiles_as_unguarded(module, kind):
    """Dynamo restarts its analysis at a graph break: the guarded call must trace the same
    way again (correct code, grad on: nothing to do, nothing said)."""
    fitter = module.Fitter()

    def step(x):
        y = module.stage(x, fitter.w) if kind == "function" else fitter.fit(x)
        torch._dynamo.graph_break()
        return y + 1

    plain_out, plain_graphs = _compile_and_count(step, fullgraph=False, grad=True)
    _install()
    with capture_events() as events:
        out, graphs = _compile_and_count(step, fullgraph=False, grad=True)
    assert out.item() == plain_out.item() and graphs == plain_graphs and events == []


def test_a_guarded_method_binds_as_a_function_does(module):
    _install()
    fitter, x = module.Fitter(), torch.ones(3)
    function = vars(module.Fitter)["fit"]
    bound = module.Fitter.fit.__get__(fitter)  # patching a method onto an instance
    assert type(bound) is types.MethodType and bound(x).item() == 3.0
    assert function.__get__(None, module.Fitter) is function
    assert module.Fitter.fit(self=fitter, x=x).item() == 3.0  # the instance by keyword
    with pytest.raises(TypeError, match="missing"):
        module.Fitter.fit(x=x)  # as unguarded


def test_an_object_without_weak_references_is_not_kept_alive(make_module):
    import gc

    slotted = importlib.import_module(
        make_module(
            "slotted_stage",
            """
            FREED = []

            class Slotted:
                __slots__ = ("scale",)

                def __init__(self):
                    self.scale = 2.0

                def fit(self, x):
                    return x * self.scale

                def __del__(self):
                    FREED.append(True)
            """,
        )
    )
    importlib.import_module("torch._dynamo")  # the guard then keeps what a rebuilt call needs
    autograd_guard.install(
        {"rules": [{"target": "slotted_stage:Slotted.fit", "action": "enable_grad"}]}
    )
    obj = slotted.Slotted()
    assert obj.fit(torch.ones(1)).item() == 2.0
    del obj
    gc.collect()
    assert slotted.FREED == [True]  # nothing of the guard holds it
