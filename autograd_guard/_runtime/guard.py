"""The contract every guard follows.

A guard is a class that reads as the bug report it answers::

    class MyGuard(Guard):
        name = "my_guard"
        distribution = "some-lib"            # whose installed version gates the guard
        affected = ">=1.3,<1.6"              # packaging specifier; "" means every version
        symptom = "..."; upstream = "https://..."; remedy = "one sentence"
        targets = (Target("somelib.mod", "func", aliases=("somelib:func",)),)

        def risky(self, instance, args, kwargs) -> bool: ...   # cheap check, every call
        def handle(self, call) -> Any: ...                      # only for risky calls

``handle`` runs the library through ``call.proceed()`` and asks ``self.report()`` before
changing anything: that logs the event, raises in ``strict`` and returns whether to
apply the fix (the reporting methods are in ``_runtime.interventions``). A guard with several
remedies names each target's own ``check``, ``handle`` and ``traced`` methods on the
``Target``. Any error of the guard's own falls back to the library's own behaviour; the
library's and the user's exceptions pass through unchanged.

The engine calls public methods, each of which calls the private hook of the same name
that a guard may override, as OpenTelemetry's ``instrument()`` calls ``_instrument()``:
``targets_to_wrap``, ``needed``, ``attach``, ``detach``, ``prelude``, ``check_for``,
``handler_for`` and ``traced``. A guard that wraps nothing (torch's global optimizer hooks) names
``modules``: ``attach`` runs on each one's import with no target. Every guard class is
checked against this contract when it is loaded (``_runtime.contract``).
"""

from __future__ import annotations

import _thread

from autograd_guard._common import versions as _versions
from autograd_guard._common.call import Call, Target
from autograd_guard._policy.options import Option
from autograd_guard._runtime import patching as _patching
from autograd_guard._runtime.interventions import Interventions
from autograd_guard._runtime.wrapper import describe_error, make_wrapper
from autograd_guard.errors import GuardError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from types import ModuleType
    from typing import Any, ClassVar, Literal

    from autograd_guard._common.call import Check
    from autograd_guard._policy.data import Policy

    # Where a guard stands; ``Guard.detail`` says more (which version, which module).
    GuardState = Literal[
        "waiting for import", "patched", "hooked", "not needed", "off", "unavailable", "error"
    ]

__all__ = ["Call", "Guard", "GuardError", "Option", "Target", "describe_error"]


class Guard(Interventions):
    """Base class of every guard. Subclasses declare the class attributes and ``handle``."""

    name: ClassVar[str] = ""
    distribution: ClassVar[str | tuple[str, ...] | None] = None
    affected: ClassVar[str] = ""
    symptom: ClassVar[str] = ""
    upstream: ClassVar[str] = ""
    remedy: ClassVar[str] = ""
    targets: ClassVar[tuple[Target, ...]] = ()
    # Modules whose import starts a guard that wraps nothing (see the module docstring).
    modules: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[dict[str, Option]] = {}
    rule_action: ClassVar[str] = ""
    rule_options: ClassVar[dict[str, Option]] = {}
    provided_by: ClassVar[str] = "autograd-guard"  # the distribution that ships the guard
    unavailable: ClassVar[str] = ""  # why a third-party guard could not be loaded
    # Its ``_traced`` remedy is traced in strict too: it knows while tracing whether a
    # call is risky, and refuses it there (see ``_compile.checks.refuse_in_graph``).
    traced_in_strict: ClassVar[bool] = False

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.mode = policy.mode_for(self.name)
        self.forced = policy.guards[self.name].force
        self.config: dict[str, Any] = policy.guards[self.name].options
        self.active = True
        self.version: str | None = None
        self.installed_as: str | None = None
        self.state: GuardState = "waiting for import"
        self.detail = ""
        self.places: list[str] = []
        self._wrappers: dict[str, Callable[..., Any]] = {}
        self._lock = _thread.allocate_lock()

    # -- the body of a guard ---------------------------------------------------------

    def risky(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """A cheap test run on every call; False lets the call through untouched."""
        return True

    def handle(self, call: Call) -> Any:
        """Deal with a risky call. Must run the library through ``call.proceed()``."""
        return call.proceed()

    def before(self, call: Call) -> Callable[[], None] | None:
        """Instead of ``risky`` and ``handle``, for a guard that checks around every call:
        runs before it, returns what to run after it. The call itself then runs in the
        wrapper's frame (a recursive target costs one frame per level)."""
        return None

    # -- hooks a guard may override ----------------------------------------------------

    def _targets_to_wrap(self) -> Iterable[Target]:
        """The callables to wrap (the declared ``targets`` unless a guard computes them)."""
        return self.targets

    def _needed(self) -> bool:
        """Whether to patch at all: the installed version is affected, or the policy forces it."""
        return self.is_affected()

    def _attach(self, module: ModuleType, target: Target | None) -> None:
        """``module`` was imported and the guard is needed: before ``target`` is wrapped,
        or, for a module of ``modules`` (target None), to hook in."""

    def _detach(self) -> None:
        """Remove what ``_attach`` added (the engine undoes the patches)."""

    def _prelude(self, module: ModuleType, target: Target) -> bool:
        """Instead of a wrapper: the guard compiled its check into ``target`` itself (no
        frame of its own), or into the library function that makes ``target``'s wrapper
        unneeded; True where it did (``_detach`` undoes it), False to wrap."""
        return False

    def _check_for(self, target: Target) -> Check:
        """The ``risky`` test for ``target``: its own ``check`` method, else ``risky``."""
        return getattr(self, target.check) if target.check else self.risky

    def _handler_for(self, target: Target) -> Callable[[Call], Any]:
        """What handles a risky call of ``target``: its own ``handle`` method, else ``handle``."""
        return getattr(self, target.handle) if target.handle else self.handle

    def _traced(self, target: Target, original: Callable[..., Any]) -> Callable[..., Any] | None:
        """A function ``torch.compile`` can trace that applies the remedy (None: none); made
        with ``autograd_guard.guard.traceable`` from a module-level template."""
        return getattr(self, target.traced)(target, original) if target.traced else None

    # -- what the engine calls -------------------------------------------------------

    def targets_to_wrap(self) -> list[Target]:
        return list(self._targets_to_wrap())

    def read_version(self) -> None:
        """Read the installed version from distribution metadata (never by importing)."""
        if self.distribution:
            self.installed_as, self.version = _versions.first_installed(self.distribution)

    def is_affected(self) -> bool:
        """The installed version is affected (or the policy forces the guard on)."""
        if self.forced or not self.distribution or not self.affected:
            return True  # forced, application code, or every version of the library
        return _versions.is_affected(self.version, self.affected)

    def needed(self) -> tuple[bool, str]:
        """Whether the guard patches here, and why, in words (for ``doctor``)."""
        self.read_version()
        needed = self._needed()
        if self.forced:
            return needed, "forced on"
        if not self.distribution:
            watched = f" (watches {', '.join(self.modules)})" if self.modules else ""
            return needed, (
                "your code, by rules" if self.rule_action else "every version"
            ) + watched
        versions = self.affected or "every version"
        if self.version is None:
            return needed, f"{self.installed_as} not installed (affected: {versions})"
        where = f"{self.installed_as} {self.version}"
        if self.is_affected():
            return needed, f"{where}: affected ({versions})"
        extra = "; patched for its options" if needed else ""
        return needed, f"{where}: not affected (only {versions} are){extra}"

    def set_state(self, state: GuardState, detail: str = "") -> None:
        self.state, self.detail = state, detail

    def notes(self) -> dict[str, Any]:
        """What the guard noted that is no event (``status()``'s ``notes``)."""
        return {}

    def attach(self, module: ModuleType, target: Target | None = None, late: bool = False) -> None:
        """``module`` was imported: gate on the version, then hook in (``_attach``) and wrap
        ``target`` (None: a module of ``modules``). ``late``: references to the target
        may exist already. Runs inside the user's import: a failure is reported, never
        raised (strict aside)."""
        try:
            self.read_version()
            if not self._needed():
                self.set_state("not needed", f"for {self.installed_as} {self.version}")
                return
            self._attach(module, target)
            if target is None:
                self.set_state("hooked", f"into {module.__name__}")
            elif self.prelude(module, target):
                self.set_state("patched", f"{target}: no wrapper (a prelude compiled into it)")
                self.places.append(str(target))
            else:
                self._wrap(module, target, late)
        except Exception as exc:
            self.set_state("error", repr(exc))
            self.fail("hook" if target is None else "patch", exc)

    def detach(self) -> None:
        """Stop: every wrapper passes calls through, and ``_detach`` removes what
        ``_attach`` added (at uninstall); a failure is reported, never raised."""
        self.active = False
        try:
            self._detach()
        except Exception as exc:
            self.emit(
                "guard error while detaching",
                action="guard_error",
                callsite=f"detach:{type(exc).__name__}",
                level="error",
                error=describe_error(exc),
            )

    def traced(self, target: Target, original: Callable[..., Any]) -> Callable[..., Any] | None:
        """The remedy ``torch.compile`` traces for ``target`` (None: none, or not in this mode)."""
        if self.mode in ("observe", "fix") or (self.mode == "strict" and self.traced_in_strict):
            return self._traced(target, original)
        return None

    def prelude(self, module: ModuleType, target: Target) -> bool:
        return self._prelude(module, target)

    def check_for(self, target: Target) -> Check:
        return self._check_for(target)

    def handler_for(self, target: Target) -> Callable[[Call], Any]:
        return self._handler_for(target)

    def switch_for(self, target: Target) -> list[Any] | None:
        """The list whose truth says whether ``target``'s wrapper runs (None: always);
        the contract checked at install that it is one."""
        return getattr(self, target.switch) if target.switch else None

    def wrapper_for(self, target: Target) -> Callable[..., Any]:
        key = str(target)
        with self._lock:
            wrapper = self._wrappers.get(key)
            if wrapper is None:
                wrapper = self._wrappers[key] = make_wrapper(
                    self, target, *self._wrapper_checks(target)
                )
        return wrapper

    # -- the engine's own steps ----------------------------------------------------------

    def _wrap(self, module: ModuleType, target: Target, late: bool) -> None:
        try:
            patched = _patching.wrap(
                module, target.qualname, self.wrapper_for(target), target.aliases, late
            )
        except (AttributeError, _patching.NotCallableTarget) as exc:
            self._untouched(module, target, exc)
            return
        if patched is None:
            return
        self.set_state("patched")
        self.places += patched.places
        if late and len(patched.places) > 1:
            self.emit(
                "target was imported before the guard; its references were updated: "
                + ", ".join(patched.places),
                action="late_patch",
                callsite=str(target),
                target=str(target),
                level="info",
                places=patched.places,
            )

    def _untouched(self, module: ModuleType, target: Target, exc: Exception) -> None:
        """A target that is missing or not a function: named in its own event, left alone."""
        if isinstance(exc, AttributeError):
            found = f"module {module.__name__!r} has no attribute {target.qualname!r}"
        else:
            found = f"{target.qualname!r} in module {module.__name__!r} is {exc}"
        self.set_state("error", f"target {target} not patched: {found}")
        named_by = f" (named by {target.rule})" if target.rule else ""
        self.emit(
            f"target {target}{named_by} left untouched: {found}",
            action="bad_target",
            callsite=str(target),
            target=str(target),
            rule=target.rule,
            level="error",
            remedy="fix the target's 'module:qualname' so that it names a function or method",
        )

    def _wrapper_checks(self, target: Target) -> tuple[bool, Check | None]:
        """Whether the guard checks around each call (it overrides ``before``), else its
        risky test for ``target`` (None where it keeps the default: every call)."""
        if type(self).before is not Guard.before:
            return True, None
        risky = self.check_for(target)
        return False, None if getattr(risky, "__func__", None) is Guard.risky else risky
