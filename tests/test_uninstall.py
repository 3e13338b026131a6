"""uninstall() leaves nothing of the guard behind: the modules of traceable remedies, the
guards themselves, a patch on a subclass; and it waits for a compile in another thread."""

from __future__ import annotations

import gc
import sys
import threading
import weakref

import pytest
import torch

import autograd_guard
from autograd_guard import guards
from autograd_guard._common import STATE
from autograd_guard.guard import Guard, Target, traceable
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
    # torch 2.1 cannot trace a held method of a guarded class with fullgraph=True at all
    fullgraph = held == "static"
    compiled = torch.compile(lambda x: run(x, w) * 2, backend="eager", fullgraph=fullgraph)
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


compiled = None  # the state of each traceable copy of _passed_through


def _passed_through(*args, **kwargs):
    return compiled.original(*args, **kwargs)


class PausesInTrace(Guard):
    """Its remedy, asked for while torch.compile traces, waits a while for an uninstall."""

    name = "pauses_in_trace"
    targets = (Target("paused", "stage", traced="_traced_stage"),)
    tracing = uninstalled = threading.Event()
    waited: list[bool] = []

    def _traced_stage(self, target, original):
        type(self).tracing.set()
        type(self).waited.append(type(self).uninstalled.wait(1.0))
        return traceable(_passed_through, original=original)


def test_uninstall_waits_for_a_compile_in_another_thread(make_module):
    make_module("paused", "def stage(x):\n    return x * 2\n")
    PausesInTrace.tracing, PausesInTrace.uninstalled = threading.Event(), threading.Event()
    PausesInTrace.waited = []
    guards.register(PausesInTrace)
    try:
        autograd_guard.install({})
        import paused

        results = []

        def compile_stage():
            try:
                step = torch.compile(lambda x: paused.stage(x) + 1, backend="eager")
                results.append(step(torch.ones(3)).tolist())
            except Exception as exc:
                results.append(f"{type(exc).__name__}: {exc}"[:300])

        def uninstall():
            autograd_guard.uninstall()
            PausesInTrace.uninstalled.set()

        compiling = threading.Thread(target=compile_stage, daemon=True)
        compiling.start()
        assert PausesInTrace.tracing.wait(60)
        uninstalling = threading.Thread(target=uninstall, daemon=True)
        uninstalling.start()
        compiling.join(timeout=60)
        uninstalling.join(timeout=60)
    finally:
        guards.unregister(PausesInTrace)
    assert not compiling.is_alive() and not uninstalling.is_alive()  # no deadlock
    assert PausesInTrace.waited == [False]  # the uninstall waited for the compile
    assert results == [[3.0, 3.0, 3.0]]


def test_install_run_by_an_import_inside_a_compile_goes_on(make_module):
    make_module(
        "installs_on_import",
        """
        from autograd_guard import install
        from autograd_guard._engine import engine as _engine

        HELD = _engine._dynamo_compile_lock()._is_owned()  # imported by the compile
        install({})
        """,
    )

    def step(x):
        import installs_on_import  # noqa: F401

        return x + 1

    results = []
    compiling = threading.Thread(
        target=lambda: results.append(torch.compile(step, backend="eager")(torch.ones(3))),
        daemon=True,
    )
    compiling.start()
    compiling.join(timeout=120)
    assert not compiling.is_alive()  # no deadlock
    assert results[0].tolist() == [2.0, 2.0, 2.0] and autograd_guard.status()["installed"]
    assert sys.modules["installs_on_import"].HELD


INHERITED = """
class Base:
    def meth(self, x):
        return x + 1

    @classmethod
    def made(cls, x):
        return x + 1

    @staticmethod
    def plain(x):
        return x + 1

    @property
    def value(self):
        return 2

class Sub(Base):
    pass
"""
NAMES = ("meth", "made", "plain", "value")


def _times(factor, *classes):
    class Times(Guard):
        name = f"times_{factor}"
        targets = tuple(Target("inherited", f"{c}.{n}") for c in classes for n in NAMES)

        def handle(self, call):
            return call.proceed() * factor

    return Times


@pytest.mark.parametrize(
    "patched", [("Sub",), ("Sub", "Base"), ("Base", "Sub"), ("Sub", "Sub"), ("Base+Sub",)]
)
def test_uninstall_restores_every_class_of_a_hierarchy(make_module, patched):
    """One guard per entry of ``patched`` (``Base+Sub``: one guard on both)."""
    make_module("inherited", INHERITED)
    import inherited

    before = {kind: dict(vars(kind)) for kind in (inherited.Base, inherited.Sub)}
    kinds = [_times(10 + i, *entry.split("+")) for i, entry in enumerate(patched)]
    for kind in kinds:
        guards.register(kind)
    try:
        autograd_guard.install({})
        sub = inherited.Sub()
        assert min(sub.meth(1), sub.made(1), sub.plain(1), sub.value) >= 20
        later = type("Later", (inherited.Sub,), {})  # a subclass made while installed
        autograd_guard.uninstall()
    finally:
        for kind in kinds:
            guards.unregister(kind)
    assert {kind: dict(vars(kind)) for kind in (inherited.Base, inherited.Sub)} == before
    assert (sub.meth(1), sub.made(1), sub.plain(1), sub.value) == (2, 2, 2, 2)
    assert later().meth(1) == 2


def test_uninstall_restores_a_wrapper_that_a_package_imported_from_its_submodule(
    make_module, tmp_path
):
    # The hook on pkgcopy.core runs before pkgcopy/__init__.py goes on to import its name:
    # the package's name then holds the wrapper although the patcher never set it there
    # (wp.launch, from warp.context, when the guard is installed before `import warp`).
    make_module("pkgcopy.core", "def stage(x, w):\n    return (x * w).sum()\n")
    (tmp_path / "modules" / "pkgcopy" / "__init__.py").write_text(
        "from pkgcopy.core import stage\n"
    )
    autograd_guard.install({"rules": [{"target": "pkgcopy.core:stage", "action": "enable_grad"}]})
    import pkgcopy

    assert pkgcopy.stage is pkgcopy.core.stage and hasattr(pkgcopy.stage, "__wrapped__")
    original = pkgcopy.core.stage.__wrapped__
    autograd_guard.uninstall()
    assert pkgcopy.core.stage is original and pkgcopy.stage is original
