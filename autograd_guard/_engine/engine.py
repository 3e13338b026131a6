"""Install and uninstall the guards: policy, post-import hooks, patches, status."""

from __future__ import annotations

import os
import sys

from autograd_guard._common import STATE
from autograd_guard._common import importer as _importer
from autograd_guard._common import versions as _versions
from autograd_guard._engine import released as _released
from autograd_guard._engine.unattached import report_unattached_rules
from autograd_guard._events import events as _events
from autograd_guard._events.sinks import printable
from autograd_guard._policy import policy as _policy
from autograd_guard._runtime import contract as _guard_contract
from autograd_guard._runtime import patching as _patching
from autograd_guard._runtime.guard import describe_error

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import ModuleType
    from typing import Any

    from autograd_guard._policy.policy import Policy
    from autograd_guard._runtime.guard import Guard, Target


def install(policy: Policy | str | Mapping[str, Any] | None = None) -> None:
    """Load the policy and hook every enabled guard's targets; replaces an earlier install.

    Raises PolicyError for an invalid policy (the auto-load catches it).
    """
    _exclusive(_install, policy)


def _install(policy: Policy | str | Mapping[str, Any] | None) -> None:
    from autograd_guard.guards import available

    uninstall()
    guard_classes = available()
    loaded = policy if isinstance(policy, _policy.Policy) else _policy.load(policy, guard_classes)
    _events.configure(loaded.log, loaded.log_source)
    _events.reset()
    _versions.clear_cache()
    STATE.policy, STATE.error = loaded, None
    for warning in [] if STATE.muted else loaded.warnings:  # the guard runs on
        sys.stderr.write(printable(f"autograd-guard: {warning}") + "\n")  # a key may hold any
    for guard_class in guard_classes:
        _start(guard_class, loaded)
    _importer.when_imported("torch._dynamo", _keep_guard_frames_uncompiled)
    if any(not rule.origin.startswith("preset ") for rule in loaded.rules):
        _events.at_exit(report_unattached_rules)


def _keep_guard_frames_uncompiled(dynamo: ModuleType) -> None:
    """See ``_compile.dynamo_frames``; where this torch lacks what it needs, the guard's frames
    are compiled as before (warnings at graph breaks), and one event says so."""
    from autograd_guard._compile import dynamo_frames as _dynamo_frames

    try:
        _dynamo_frames.dynamo_imported(dynamo)
    except Exception as exc:
        _events.emit(
            "the guard's own frames may be compiled by torch.compile in this torch",
            guard="engine",
            action="guard_error",
            callsite="torch._dynamo",
            level="warning",
            error=describe_error(exc),
            remedy="a bug in the guard: please report it with this event",
        )


def _start(guard_class: type[Guard], policy: Policy) -> None:
    """Set one guard up; a guard that breaks here is reported and the others go on."""
    try:
        guard = guard_class(policy)
    except Exception as exc:
        _events.emit(
            f"guard {guard_class.name!r} could not start; it is off",
            guard=guard_class.name,
            action="guard_error",
            callsite="start",
            level="error",
            error=describe_error(exc),
        )
        return
    STATE.guards.append(guard)
    if guard.unavailable:
        guard.set_state("unavailable", guard.unavailable)
        return
    if guard.mode == "off":
        guard.set_state("off")
        return
    targets = _checked_targets(guard)
    if targets is None:
        return
    for target in targets:
        _hook_target(guard, target)
    for name in guard.modules:
        _importer.when_imported(name, guard.attach)  # fails open itself


def _checked_targets(guard: Guard) -> list[Target] | None:
    """The guard's targets; None where computing them broke, or they break the contract
    (named in an event: the message holds no user data, only the guard's own names)."""
    try:
        targets = guard.targets_to_wrap()
    except Exception as exc:
        guard.set_state("error", repr(exc))
        guard.fail("watch", exc)
        return None
    try:
        _guard_contract.check_targets(guard, targets)
    except TypeError as exc:
        guard.set_state("unavailable", str(exc))
        guard.emit(
            f"guard {guard.name!r} is off: {exc}",
            action="load_error",
            callsite="start",
            level="error",
            remedy="fix the guard: see the guard contract in autograd_guard.guard",
        )
        return None
    return targets


def _hook_target(guard: Guard, target: Target) -> None:
    def hook_target(_: object = None) -> None:
        late = target.module in sys.modules
        _importer.when_imported(target.module, _attach_hook(guard, target, late))

    if target.after is None:
        hook_target()
    else:  # wait for the trigger module first
        _importer.when_imported(target.after, _fail_open(guard, hook_target))


def _fail_open(guard: Guard, hook: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def safe(module: ModuleType) -> None:
        # Runs inside the user's import: an exception here would break that import.
        try:
            hook(module)
        except Exception as exc:
            guard.fail("hook", exc)

    return safe


def _attach_hook(guard: Guard, target: Target, late: bool) -> Callable[[ModuleType], None]:
    first = [late]

    def attach(module: ModuleType) -> None:
        guard.attach(module, target, first[0])  # fails open itself
        first[0] = True  # a reload: old references may be about

    return attach


def uninstall() -> None:
    """Unhook, restore every patched object, and keep the event counts for the summary."""
    _exclusive(_uninstall)


def _uninstall() -> None:
    _importer.clear()
    for guard in STATE.guards:
        guard.detach()
    replacements = [replacement for *_, replacement in STATE.applied]
    skipped = _patching.undo_all()
    _released.uninstalled(replacements)
    for place in skipped:
        sys.stderr.write(f"autograd-guard: {place} was re-patched by someone else; left as it is\n")
    STATE.forget_install()


def settle() -> list[dict[str, Any]]:
    """The end of one run inside the process (a test of a guarded pytest session): each
    guard that keeps a run's state says now what it would say of it at exit, and starts
    afresh; call sites are logged anew after it. Returns the events that were strict
    findings (the exit status they set is left to the caller: cleared here)."""
    found: list[dict[str, Any]] = []

    def listen(record: dict[str, Any]) -> None:
        found.append(record)

    before = STATE.exit_status
    STATE.exit_status = 0
    _events.add_listener(listen)
    try:
        for guard in list(STATE.guards):
            if guard.active and hasattr(guard, "settle"):
                guard.settle()
    finally:
        _events.remove_listener(listen)
        failed, STATE.exit_status = STATE.exit_status, before
        _events.reset()
    return [e for e in found if e.get("level") == "error"] if failed else []


def _exclusive(run: Callable[..., None], *args: Any) -> None:
    """Run ``run`` holding the engine's lock and, once ``torch._dynamo`` is imported,
    Dynamo's compile lock before it (one order): a torch.compile in another thread never
    traces half-patched targets (Dynamo's internal errors), and none starts before the
    patches are all done or undone. Both are reentrant: install() run by the compiling
    thread itself (a post-import hook inside a compile) goes on."""
    import contextlib

    STATE.follow_forks()
    with _dynamo_compile_lock() or contextlib.nullcontext(), STATE.engine_lock:
        run(*args)


def _dynamo_compile_lock() -> Any:
    """The lock each torch.compile holds while it compiles a frame (``convert_frame``,
    ``eval_frame`` in torch < 2.2); None before ``torch._dynamo`` is imported."""
    for name in ("torch._dynamo.convert_frame", "torch._dynamo.eval_frame"):
        lock = getattr(sys.modules.get(name), "compile_lock", None)
        if lock is not None:
            return lock
    return None


def install_from_environment(environ: Mapping[str, str] | None = None) -> None:
    """The auto-load: install what can be used of the policy; a problem stops the program
    at its import of torch where strict was asked for (see ``_policy.failure``)."""
    from autograd_guard._policy import failure as _policy_failure
    from autograd_guard.guards import available

    environ = os.environ if environ is None else environ
    policy = _policy_failure.autoload(environ, available())
    if policy is not None:
        install(policy)
        _events.in_first_event(policy=f"{policy.source}, {policy.why}")


def status() -> dict[str, Any]:
    STATE.follow_forks()
    with STATE.engine_lock:
        policy = STATE.policy
        return {
            "installed": policy is not None,
            "auto_loaded": STATE.started,
            "policy": policy.source if policy else None,
            "mode": (policy.env_mode or policy.mode) if policy else None,
            "log": STATE.log,
            "error": STATE.error,
            "watching": _importer.watched(),
            "guards": {
                g.name: {
                    "mode": g.mode,
                    "distribution": g.installed_as or g.distribution,
                    "provided_by": g.provided_by,
                    "version": g.version,
                    "affected": g.affected or "all versions",
                    "state": g.state,
                    "detail": g.detail,
                    "patched": list(g.places),
                    "notes": g.notes(),
                }
                for g in STATE.guards
            },
            "events": _events.summary(),
        }
