"""The shared engine, driven by a small guard over a module written by the test."""

from __future__ import annotations

import importlib
import inspect
import json
import sys

import pytest
from helpers import assert_attached

import autograd_guard
from autograd_guard import guards
from autograd_guard._engine import engine as _engine
from autograd_guard._runtime.guard import Guard, Option, Target
from autograd_guard.testing import capture_events

TOY_CORE = '''
def compute(x, scale=2):
    """Multiply x by scale."""
    if x == "boom":
        raise ValueError("user error")
    return x * scale
'''


class ToyGuard(Guard):
    """Intervenes when x is negative: the fix makes it positive."""

    name = "toy"
    symptom = "negative inputs"
    remedy = "pass a positive number"
    targets = (Target("toy_pkg.core", "compute", aliases=("toy_pkg:compute",)),)
    options = {"fail_in": Option(str, "", choices=("", "check", "before", "after"))}

    def risky(self, instance, args, kwargs):
        if self.config["fail_in"] == "check":
            raise KeyError("check broke")
        return not isinstance(args[0], str) and args[0] < 0

    def handle(self, call):
        if self.config["fail_in"] == "before":
            raise KeyError("before broke")
        if self.report(call, "negate", "negative input made positive", value_kind="int"):
            result = call.proceed((-call.args[0], *call.args[1:]))
        else:
            result = call.proceed()
        if self.config["fail_in"] == "after":
            raise KeyError("after broke")
        return result


@pytest.fixture
def toy(make_module):
    make_module("toy_pkg.core", TOY_CORE)
    with open(sys.path[0] + "/toy_pkg/__init__.py", "w") as f:
        f.write("from toy_pkg.core import compute\n")
    guards.register(ToyGuard)
    yield
    guards.unregister(ToyGuard)


def policy(**toy):
    """Only the toy guard: the built-in ones are switched off to keep these tests apart."""
    return {"disable": [g.name for g in guards.builtin()], "guards": {"toy": toy}}


def test_hook_fires_on_import_and_patches_the_reexport(toy):
    autograd_guard.install(policy())
    import toy_pkg
    import toy_pkg.core

    assert toy_pkg.compute is toy_pkg.core.compute
    assert toy_pkg.core.compute.__wrapped__.__name__ == "compute"
    with capture_events() as events:
        assert toy_pkg.compute(-3) == 6
    assert events[0]["action"] == "negate" and events[0]["target"] == "toy_pkg.core:compute"
    assert autograd_guard.status()["guards"]["toy"]["state"] == "patched"


def test_signature_and_docstring_are_kept(toy):
    import toy_pkg.core

    original = toy_pkg.core.compute
    autograd_guard.install(policy())
    assert toy_pkg.core.compute is not original
    assert inspect.signature(toy_pkg.core.compute) == inspect.signature(original)
    assert toy_pkg.core.compute.__doc__ == original.__doc__


def test_target_imported_before_the_guard(toy, make_module):
    make_module("toy_user", "from toy_pkg.core import compute\n")
    import toy_pkg
    import toy_user

    original = toy_user.compute
    with capture_events() as events:
        autograd_guard.install(policy())
    assert toy_user.compute is toy_pkg.compute is toy_pkg.core.compute is not original
    [late] = [e for e in events if e["action"] == "late_patch" and e["guard"] == "toy"]
    assert "toy_user:compute" in late["places"]
    autograd_guard.uninstall()
    assert toy_user.compute is toy_pkg.compute is toy_pkg.core.compute is original


def test_uninstall_restores_identity_and_install_is_idempotent(toy):
    import toy_pkg.core

    original = toy_pkg.core.compute
    autograd_guard.install(policy())
    autograd_guard.install(policy())  # a second install replaces the first
    assert toy_pkg.core.compute.__wrapped__ is original  # wrapped exactly once
    autograd_guard.uninstall()
    assert toy_pkg.core.compute is original
    assert toy_pkg.compute is original
    autograd_guard.uninstall()  # harmless twice


def test_uninstall_forgets_caches_and_reset_forgets_registrations(toy):
    from autograd_guard._common import STATE
    from autograd_guard._common import versions as _versions
    from autograd_guard._common.cache import DiskCache

    autograd_guard.install(policy())
    _versions.installed_version("pytest")
    DiskCache.shared()
    assert STATE.versions and STATE.disk_cache is not None
    autograd_guard.uninstall()
    assert not STATE.versions and STATE.disk_cache is None and not STATE.guards
    assert ToyGuard in STATE.registered  # kept for the next install
    STATE.reset()
    assert ToyGuard not in guards.available()


def test_reload_is_patched_again(toy):
    autograd_guard.install(policy())
    import toy_pkg.core

    importlib.reload(toy_pkg.core)
    assert hasattr(toy_pkg.core.compute, "__wrapped__")
    assert not hasattr(toy_pkg.core.compute.__wrapped__, "__wrapped__")
    assert toy_pkg.core.compute(-1) == 2


def test_stale_wrapper_passes_through_after_uninstall(toy):
    autograd_guard.install(policy())
    import toy_pkg.core

    kept = toy_pkg.core.compute
    assert_attached("toy", "toy_pkg.core:compute")  # kept is the wrapper, not the original
    autograd_guard.uninstall()
    with capture_events() as events:
        assert kept(-1) == -2  # no fix, no event
    assert events == []


def test_user_exceptions_pass_through_unchanged(toy):
    autograd_guard.install(policy())
    import toy_pkg.core

    with pytest.raises(ValueError, match="user error") as info:
        toy_pkg.core.compute("boom")
    assert info.value.__cause__ is None


@pytest.mark.parametrize("stage", ["check", "before", "after"])
def test_guard_failures_fail_open(toy, stage):
    autograd_guard.install(policy(fail_in=stage))
    import toy_pkg.core

    with capture_events() as events:
        for _ in range(3):
            result = toy_pkg.core.compute(-3)
    # What the library alone returns, except where the fix had already run.
    assert result == (6 if stage == "after" else -6)
    errors = [e for e in events if e["action"] == "guard_error"]
    # The exception's type and where it was raised; never its message (user data).
    assert len(errors) == 1 and errors[0]["error"].startswith("builtins.KeyError raised in ")
    assert "broke" not in errors[0]["error"]


def _fails(mapping: dict[str, int]) -> int:
    return mapping["secret value"]


def test_guard_error_names_the_module_not_the_file():
    """A guard_error names where it was raised by module (file names such as a package's
    __init__.py repeat), never the message."""
    from autograd_guard._runtime.wrapper import describe_error

    try:
        _fails({})
    except KeyError as exc:
        text = describe_error(exc)
    assert (
        text
        == f"builtins.KeyError raised in _fails ({__name__}:{_fails.__code__.co_firstlineno + 1})"
    )
    assert "secret" not in text


def test_guard_failure_in_strict_raises(toy):
    autograd_guard.install({**policy(fail_in="check"), "mode": "strict"})
    import toy_pkg.core

    with pytest.raises(autograd_guard.GuardError, match="failed in check"):
        toy_pkg.core.compute(1)


def test_modes(toy):
    import toy_pkg.core

    autograd_guard.install({**policy(), "mode": "observe"})
    with capture_events() as events:
        assert toy_pkg.core.compute(-3) == -6
    assert events[0]["mode"] == "observe"
    autograd_guard.install({**policy(), "mode": "strict"})
    with pytest.raises(autograd_guard.GuardError) as info:
        toy_pkg.core.compute(-3)
    assert "toy" in str(info.value) and "pass a positive number" in str(info.value)
    assert __file__ in str(info.value)
    autograd_guard.install({**policy(), "mode": "off"})
    assert toy_pkg.core.compute(-3) == -6
    assert autograd_guard.status()["guards"]["toy"]["state"] == "off"


def test_a_hook_that_raises_does_not_break_the_import(toy, monkeypatch):
    def broken(self, module, target):
        raise RuntimeError("hook broke")

    monkeypatch.setattr(ToyGuard, "_attach", broken)
    autograd_guard.install(policy())
    with capture_events() as events:
        import toy_pkg.core
    assert toy_pkg.core.compute(2) == 4
    assert [e["callsite"] for e in events] == ["patch:RuntimeError"]
    assert autograd_guard.status()["guards"]["toy"]["state"] == "error"


def test_version_gate_reads_metadata(toy, monkeypatch):
    from importlib.metadata import version

    installed = version("packaging")
    import toy_pkg.core

    original = toy_pkg.core.compute
    monkeypatch.setattr(ToyGuard, "distribution", "packaging")
    monkeypatch.setattr(ToyGuard, "affected", f"<{installed}")
    autograd_guard.install(policy())
    assert toy_pkg.core.compute is original
    toy = autograd_guard.status()["guards"]["toy"]
    assert toy["state"] == "not needed" and "for packaging" in toy["detail"]
    autograd_guard.install(policy(force=True))
    assert toy_pkg.core.compute is not original
    monkeypatch.setattr(ToyGuard, "affected", f">={installed}")
    autograd_guard.install(policy())
    assert toy_pkg.core.compute is not original
    assert autograd_guard.status()["guards"]["toy"]["version"] == installed


def test_events_once_per_callsite_with_counts(toy):
    autograd_guard.install(policy())
    import toy_pkg.core

    with capture_events() as events:
        for _ in range(5):
            toy_pkg.core.compute(-1)
        toy_pkg.core.compute(-1)
    assert len(events) == 2
    rows = [r for r in autograd_guard.status()["events"] if r["guard"] == "toy"]
    assert sorted(r["count"] for r in rows) == [1, 5]


def test_json_lines_log_has_the_required_fields_and_no_values(toy, tmp_path, monkeypatch):
    import torch

    log = tmp_path / "events.jsonl"
    monkeypatch.setenv("RANK", "3")
    autograd_guard.install({**policy(), "log": str(log)})
    import toy_pkg.core

    toy_pkg.core.compute(-1)
    from autograd_guard._events import events as _events

    _events.emit(
        "has a tensor", guard="toy", action="x", callsite="c", tensor=torch.full((2, 2), 123456.0)
    )
    records = [json.loads(line) for line in log.read_text().splitlines()]
    first = records[0]
    for key in (
        "event",
        "guard",
        "action",
        "target",
        "callsite",
        "pid",
        "rank",
        "remedy",
        "timestamp",
        "level",
    ):
        assert key in first, key
    assert first["rank"] == 3
    assert "123456" not in log.read_text()
    assert records[1]["tensor"] == "<Tensor shape=(2, 2) torch.float32>"


def test_status_reports_the_policy(toy):
    autograd_guard.install(policy())
    state = autograd_guard.status()
    assert state["installed"] and state["mode"] == "fix" and state["policy"] == "<dict>"
    assert "toy_pkg.core" in state["watching"]
    autograd_guard.uninstall()
    assert not autograd_guard.status()["installed"]


def test_install_from_environment_with_an_invalid_policy_uses_the_rest(
    toy, tmp_path, monkeypatch, capsys
):
    (tmp_path / "autograd_guard.toml").write_text('mode = "loud"\n')
    _engine.install_from_environment({})
    assert autograd_guard.status()["installed"] and autograd_guard.status()["error"] is None
    assert "autograd_guard.toml: mode: invalid value 'loud'" in capsys.readouterr().err
    # strict stops the program at its import of torch: tests/test_policy_failure.py and
    # test_autoload.py


class HookGuard(Guard):
    """Wraps nothing: hooks into toy_pkg.core when it is imported."""

    name = "toy_hooks"
    modules = ("toy_pkg.core",)
    options = {"fail_in": Option(str, "", choices=("", "import", "uninstall"))}
    calls: list[str] = []

    def _attach(self, module, target):
        if self.config["fail_in"] == "import":
            raise KeyError("import broke")
        self.calls.append(f"import {module.__name__}")

    def _detach(self):
        self.calls.append("uninstall")
        if self.config["fail_in"] == "uninstall":
            raise KeyError("uninstall broke")


@pytest.fixture
def hook_guard(toy):
    HookGuard.calls = []
    guards.register(HookGuard)
    yield HookGuard.calls
    guards.unregister(HookGuard)


@pytest.mark.parametrize("imported_first", [False, True])
def test_a_guard_without_targets_is_attached_and_detached(hook_guard, imported_first):
    if imported_first:
        import toy_pkg.core
    autograd_guard.install({})
    import toy_pkg.core  # noqa: F401

    assert hook_guard == ["import toy_pkg.core"]
    toy_hooks = autograd_guard.status()["guards"]["toy_hooks"]
    assert (toy_hooks["state"], toy_hooks["detail"]) == ("hooked", "into toy_pkg.core")
    autograd_guard.uninstall()
    assert hook_guard == ["import toy_pkg.core", "uninstall"]


@pytest.mark.parametrize("stage", ["import", "uninstall"])
def test_a_failing_module_hook_never_breaks_the_import(hook_guard, stage):
    autograd_guard.install({"guards": {"toy_hooks": {"fail_in": stage}}})
    with capture_events() as events:
        import toy_pkg.core

        assert toy_pkg.core.compute(2) == 4
        autograd_guard.uninstall()
    [event] = events
    assert event["action"] == "guard_error" and event["guard"] == "toy_hooks"
    assert event["callsite"] == ("hook:KeyError" if stage == "import" else "detach:KeyError")


def test_a_module_hook_is_gated_on_the_version(hook_guard, monkeypatch):
    from importlib.metadata import version

    monkeypatch.setattr(HookGuard, "distribution", "packaging")
    monkeypatch.setattr(HookGuard, "affected", f"<{version('packaging')}")
    autograd_guard.install({})
    import toy_pkg.core  # noqa: F401

    assert hook_guard == []
    toy_hooks = autograd_guard.status()["guards"]["toy_hooks"]
    assert toy_hooks["state"] == "not needed" and "for packaging" in toy_hooks["detail"]


def test_no_cache_folder_without_a_home(monkeypatch, tmp_path):
    # Issue 19 item 11: HOME and XDG_CACHE_HOME unset, and a uid without a passwd entry.
    import pwd

    from autograd_guard._common import environment as _environment
    from autograd_guard._common.cache import DiskCache

    def no_entry(uid: int) -> None:
        raise KeyError(uid)

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    assert _environment.cache_folder() is None
    DiskCache(_environment.cache_folder()).put_plan("key", {"modules": []})
    assert list(tmp_path.iterdir()) == []  # the working directory (see conftest)
    assert _environment.cache_folder({"XDG_CACHE_HOME": "relative"}) is None
    assert _environment.cache_folder({"HOME": "/home/u"}) == "/home/u/.cache/autograd-guard"
    assert _environment.cache_folder({"XDG_CACHE_HOME": "/c"}) == "/c/autograd-guard"


class InheritedMethodGuard(Guard):
    name = "inherited_method"
    targets = (Target("inherit_pkg", "Sub.meth"),)

    def handle(self, call):
        return call.proceed() * 10


def test_uninstall_of_an_inherited_method_lets_the_base_show_through(make_module):
    make_module(
        "inherit_pkg",
        """
        class Base:
            def meth(self, x):
                return x + 1

        class Sub(Base):
            pass
        """,
    )
    import inherit_pkg

    guards.register(InheritedMethodGuard)
    autograd_guard.install({})
    assert inherit_pkg.Sub().meth(1) == 20 and "meth" in vars(inherit_pkg.Sub)
    autograd_guard.uninstall()
    assert "meth" not in vars(inherit_pkg.Sub)  # as before the install: inherited
    inherit_pkg.Base.meth = lambda self, x: x + 100  # a later patch of the base
    assert inherit_pkg.Sub().meth(1) == 101
