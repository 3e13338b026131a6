"""The guard contract, over every built-in guard, and what a guard that breaks it gets.

Each built-in guard reads as the bug report it answers (its module docstring names the
symptom, the affected versions, the upstream report and the remedy), passes the check
that every guard class gets when it is loaded, and gives every target it would wrap a
check and a handler of the right shape. Third-party guards that break the contract are
refused at load time with a message naming the guard, the attribute and what is allowed.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

import autograd_guard
from autograd_guard import guards
from autograd_guard._common import STATE
from autograd_guard._policy import policy as _policy
from autograd_guard._runtime import contract as _guard_contract
from autograd_guard.guard import Call, Guard, Option, Target
from autograd_guard.guards import BUILTIN, builtin
from autograd_guard.testing import capture_events

# Rules, so that the guards that wrap what a policy names have targets to check.
POLICY = {
    "rules": [
        {"target": "pipeline.stages:reconstruct", "action": "enable_grad"},
        {"target": "pipeline.kernels:launch", "action": "snapshot"},
    ],
    "guards": {"ipex_xpu": {"crosscheck": ["pipeline.models:Tokenizer"]}},
}


@pytest.fixture(params=BUILTIN)
def guard_class(request) -> type[Guard]:
    return importlib.import_module(f"autograd_guard.guards.{request.param}").GUARD


def test_every_builtin_guard_is_loaded():
    assert [g.name for g in builtin()] == list(BUILTIN)


def test_reads_as_the_bug_report(guard_class):
    doc = inspect.getmodule(guard_class).__doc__
    assert doc.startswith(f"Guard ``{guard_class.name}``: ")
    sections = ["Symptom:", "Affected:", "Remedy:"] + (
        ["Upstream:"] if guard_class.upstream else []
    )
    for section in sections:
        assert f"\n{section} " in doc, section
    assert guard_class.symptom and guard_class.remedy
    assert guard_class.upstream.startswith("https://") or not guard_class.upstream


def test_passes_the_load_time_check(guard_class):
    _guard_contract.check(guard_class)  # raises TypeError on a broken contract


def test_every_target_gets_a_check_and_a_handler(guard_class):
    guard = guard_class(_policy.load(POLICY, builtin(), environ={}))
    targets = guard.targets_to_wrap()
    assert targets or guard_class.modules, "wraps something, or watches modules"
    _guard_contract.check_targets(guard, targets)
    for target in targets:
        assert callable(guard.check_for(target)) and callable(guard.handler_for(target))
    needed, why = guard.needed()
    assert isinstance(needed, bool) and why


def test_public_methods_call_the_hooks_of_the_same_name():
    for hook in _guard_contract.HOOKS:
        if hook.startswith("_"):
            assert callable(getattr(Guard, hook[1:])), f"{hook[1:]} calls {hook}"


def test_a_target_with_its_own_remedy_is_dispatched_to_it():
    class TwoRemedies(Guard):
        name = "two_remedies"
        targets = (
            Target("json", "dumps", check="_never", handle="_first"),
            Target("json", "loads", handle="_second"),
        )

        def _never(self, instance, args, kwargs):
            return False

        def _first(self, call):
            return "first"

        def _second(self, call):
            return "second"

    guard = TwoRemedies(_policy.load({}, [*builtin(), TwoRemedies], environ={}))
    dumps, loads = TwoRemedies.targets
    assert guard.check_for(dumps)(None, (), {}) is False
    assert guard.check_for(loads).__func__ is Guard.risky
    assert guard.handler_for(dumps)(None) == "first"
    assert guard.handler_for(loads)(None) == "second"


def _guard(**attributes) -> type[Guard]:
    return type("Broken", (Guard,), {"name": "broken", **attributes})


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"name": "not a name"}, "name 'not a name' must be a policy key"),
        ({"attach": lambda self, module: None}, "'attach' is the engine's; override '_attach'"),
        ({"check_for": lambda self, t: None}, "'check_for' is the engine's; override '_check_for'"),
        ({"affected": "1.3 to 1.6"}, "affected '1.3 to 1.6' must be a version specifier"),
        ({"distribution": ["warp-lang"]}, "distribution ['warp-lang'] must be None, a name"),
        ({"targets": (("json", "dumps"),)}, "targets is (('json', 'dumps'),); it must be a tuple"),
        ({"options": {"on": True}}, "options must be a dict of name -> Option"),
        ({"modules": "torch.optim"}, "modules is 'torch.optim'; it must be a tuple"),
        (
            {"_on_import": lambda self, module: None},
            "'_on_import' is no longer called; override '_attach'",
        ),
        (
            {"intervene": lambda self, *a: True},
            "'intervene' is no longer called; override 'report'",
        ),
        (
            {"risky": lambda self, args, kwargs: True},
            "risky(self, args, kwargs) must take (self, instance, args, kwargs)",
        ),
        ({"handle": lambda self: None}, "handle(self) must take (self, call)"),
        (
            {"_attach": lambda self, module: None},
            "_attach(self, module) must take (self, module, target)",
        ),
        (
            {"targets": (Target("json", "dumps", handle="_missing"),)},
            "target json:dumps names handle='_missing', which is not a method of the guard",
        ),
        (
            {
                "targets": (Target("json", "dumps", check="_check"),),
                "_check": lambda self, call: True,
            },
            "_check(self, call) must take (self, instance, args, kwargs)",
        ),
    ],
)
def test_a_broken_guard_is_refused_naming_what_is_wrong(attributes, message):
    with pytest.raises(TypeError) as raised:
        guards.register(_guard(**attributes))
    assert message in str(raised.value)
    assert "guard test_guard_contract.Broken: " in str(raised.value)


def test_hooks_with_defaults_or_star_args_are_accepted():
    guards.register(
        _guard(
            risky=lambda self, instance, args, kwargs, extra=None: True,
            handle=lambda self, *args: None,
            options={"on": Option(bool, True)},
            affected=">=1.3.0,<1.6.0, !=1.4.*",
            distribution=("warp-lang", "warp"),
        )
    )


def test_static_and_class_methods_dashed_names_and_lists_are_accepted():
    guards.register(
        _guard(
            name="my-guard",
            risky=staticmethod(lambda instance, args, kwargs: True),
            handle=classmethod(lambda cls, call: None),
            targets=[Target("json", "dumps", check="_check"), Target("json", "loads")],
            _check=staticmethod(lambda instance, args, kwargs: False),
            modules=["json"],
        )
    )


def test_a_subclass_hook_that_no_target_uses_is_refused():
    from autograd_guard.guards.warp_torch_args import WarpTorchArgs

    class MyWarp(WarpTorchArgs):
        def risky(self, instance, args, kwargs):
            return False  # never called: each Warp target names its own check

    with pytest.raises(TypeError, match="risky is never called: every target names its own check"):
        guards.register(MyWarp)


def test_a_guard_error_while_attaching_never_breaks_the_import_outside_strict(make_module):
    make_module("attach_pkg", "def run(x):\n    return x\n")

    class RefusesToAttach(Guard):
        name = "refuses_to_attach"
        targets = (Target("attach_pkg", "run"),)

        def _attach(self, module, target):
            raise autograd_guard.GuardError("a bug of the guard's own")

    guards.register(RefusesToAttach)
    autograd_guard.install({})
    with capture_events() as events:
        import attach_pkg

    assert attach_pkg.run(3) == 3
    assert [e["callsite"] for e in events] == ["patch:GuardError"]
    assert autograd_guard.status()["guards"]["refuses_to_attach"]["state"] == "error"


def test_computed_targets_are_checked_at_install():
    class ComputesBadTargets(Guard):
        name = "computes_bad_targets"

        def _targets_to_wrap(self):
            return [Target("json", "dumps", handle="_nowhere")]

    guards.register(ComputesBadTargets)
    with capture_events() as events:
        autograd_guard.install({})
    status = autograd_guard.status()["guards"]["computes_bad_targets"]
    assert status["state"] == "unavailable" and "_nowhere" in status["detail"]
    [event] = [e for e in events if e["guard"] == "computes_bad_targets"]
    assert event["action"] == "load_error" and event["level"] == "error"
    assert "names handle='_nowhere', which is not a method of the guard" in event["event"]


def test_the_handler_gets_the_call():
    seen: list[Call] = []

    class Seeing(Guard):
        name = "seeing"
        targets = (Target("json", "dumps", handle="_seen"),)

        def _seen(self, call):
            seen.append(call)
            return call.proceed()

    guards.register(Seeing)
    autograd_guard.install({})
    import json

    assert json.dumps([1]) == "[1]"
    assert autograd_guard.status()["guards"]["seeing"]["state"] == "patched"
    [call] = seen
    assert call.args == ([1],) and call.original.__name__ == "dumps"


def _switched_guard(log: list[str], switch: str = "_on") -> type[Guard]:
    """A guard whose targets' wrappers run only while its list ``_on`` is not empty."""

    class Switched(Guard):
        name = "switched"
        targets = (
            Target("kernels", "launch", check="_check", switch=switch),
            Target("kernels", "Buffer.write", check="_check", switch=switch),
        )

        def __init__(self, *args):
            super().__init__(*args)
            self._on: list[bool] = [True]
            self._flag = True

        def _check(self, instance, args, kwargs):
            log.append(f"check {args[-1]}")
            return False

    return Switched


KERNELS = """
    calls = []
    def launch(x):
        calls.append(x)
        return x * 2
    class Buffer:
        def write(self, x):
            calls.append(x)
            return x + 1
"""


def test_while_its_switch_is_empty_the_wrapper_does_not_run(make_module):
    log: list[str] = []
    guard_class = _switched_guard(log)
    guards.register(guard_class)
    make_module("kernels", KERNELS)
    autograd_guard.install({})
    import kernels

    [guard] = [g for g in STATE.guards if isinstance(g, guard_class)]
    guard._on.clear()
    buffer = kernels.Buffer()
    assert kernels.launch(3) == 6 and buffer.write(5) == 6
    assert kernels.Buffer.write(buffer, 1) == 2 and kernels.Buffer.write(self=buffer, x=2) == 3
    assert log == [] and kernels.calls == [3, 5, 1, 2]
    guard._on.append(True)
    assert kernels.launch(4) == 8 and buffer.write(6) == 7
    assert log == ["check 4", "check 6"]


def test_a_switch_that_is_not_a_list_is_named_at_install(make_module):
    guards.register(_switched_guard([], switch="_flag"))
    make_module("kernels", KERNELS)
    with capture_events() as events:
        autograd_guard.install({})
        import kernels

        assert kernels.launch(1) == 2
    [error] = [e for e in events if e["action"] == "load_error"]
    assert "target kernels:launch names switch='_flag', which must be a list" in error["event"]
    assert error["event"].endswith("not bool")
