"""uninstall() leaves nothing of the guard behind: the modules of traceable remedies, the
guards themselves, a patch on a subclass; and it waits for a compile in another thread."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest
import torch

import autograd_guard
from autograd_guard import guards
from autograd_guard._guard import Guard, Target
from autograd_guard._state import STATE
from autograd_guard.testing import capture_events, guarded

CYCLED = """
def stage(x, w):
    return (x * w).sum()

class Fitter:
    def run(self, x, w):
        return (x * w).sum()

    @staticmethod
    def solve(x, w):
        return (x * w).sum()
"""
RULES = {
    "rules": [
        {"target": f"cycled:{name}", "action": "enable_grad"}
        for name in ("stage", "Fitter.run", "Fitter.solve")
    ]
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _traced_modules():
    return [name for name in sys.modules if name.startswith("autograd_guard._traced_")]


def _grad_mode():
    return next(guard for guard in STATE.guards if guard.name == "grad_mode")


def test_install_cycles_leave_no_traced_module_and_free_the_guards(make_module):
    make_module("cycled", CYCLED)
    w, freed = torch.ones(3, requires_grad=True), []
    for _ in range(3):
        with guarded(RULES):
            import cycled

            freed.append(weakref.ref(_grad_mode()))
            compiled = torch.compile(lambda x: cycled.stage(x, w), backend="eager")
            with torch.no_grad():
                assert compiled(torch.ones(3)).requires_grad  # the traced remedy
            assert _traced_modules()
        assert _traced_modules() == []
    del compiled
    gc.collect()
    assert [ref() for ref in freed] == [None, None, None]


def test_a_proxy_held_after_uninstall_compiles_as_its_original(make_module):
    make_module("cycled", CYCLED)
    autograd_guard.install(RULES)
    import cycled

    w, stage = torch.ones(3, requires_grad=True), cycled.stage  # held past uninstall
    compiled = torch.compile(lambda x: stage(x, w), backend="eager", fullgraph=True)
    with torch.no_grad():
        assert compiled(torch.ones(3)).requires_grad
        autograd_guard.uninstall()
        assert _traced_modules() == []
        fresh = torch.compile(lambda x: stage(x, w) * 2, backend="eager", fullgraph=True)
        with capture_events() as events:
            assert not compiled(torch.ones(3)).requires_grad  # recompiled, unguarded
            assert not fresh(torch.ones(3)).requires_grad
            assert not stage(torch.ones(3), w).requires_grad
    assert events == []
    assert stage(torch.ones(3), w).item() == 3.0


@pytest.mark.parametrize("held", ["bound", "static"])
def test_a_method_held_after_uninstall_compiles_as_its_original(make_module, held):
    make_module("cycled", CYCLED)
    autograd_guard.install(RULES)
    import cycled

    w = torch.ones(3, requires_grad=True)
    run = cycled.Fitter().run if held == "bound" else cycled.Fitter.solve
    autograd_guard.uninstall()
    compiled = torch.compile(lambda x: run(x, w) * 2, backend="eager")
    with torch.no_grad(), capture_events() as events:
        out = compiled(torch.ones(3))
    assert out.item() == 6.0 and not out.requires_grad
    assert events == [] and _traced_modules() == []


HELD = """
class Base:
    def meth(self, x):
        return x + 1

class Sub(Base):
    pass

runner = Sub()

def __getattr__(name):  # a lazy attribute, made on each access
    if name == "lazy":
        def lazy(x):
            return x + 1
        return lazy
    raise AttributeError(name)
"""


class TimesTen(Guard):
    name = "times_ten"
    targets = (Target("held_pkg", "runner.meth"), Target("held_pkg", "lazy"))

    def handle(self, call):
        return call.proceed() * 10


@pytest.fixture
def times_ten(make_module):
    make_module("held_pkg", HELD)
    guards.register(TimesTen)
    yield
    guards.unregister(TimesTen)


def test_uninstall_of_an_instances_method_lets_its_class_show_through(times_ten):
    import held_pkg

    autograd_guard.install({})
    assert held_pkg.runner.meth(1) == 20
    autograd_guard.uninstall()
    assert "meth" not in vars(held_pkg.runner)  # as before the install: from its class
    held_pkg.Sub.meth = lambda self, x: x + 100  # a later patch of the class
    assert held_pkg.runner.meth(1) == 101


def test_uninstall_of_a_lazy_module_attribute_lets_its_getattr_show_through(times_ten):
    import held_pkg

    autograd_guard.install({})
    assert held_pkg.lazy(1) == 20
    autograd_guard.uninstall()
    assert "lazy" not in vars(held_pkg) and held_pkg.lazy(1) == 2
