"""The contract every guard follows, and the fail-open wrapper the engine puts around it.

A guard is a class that reads as the bug report it answers::

    class MyGuard(Guard):
        name = "my_guard"
        distribution = "some-lib"            # whose installed version gates the guard
        affected = ">=1.3,<1.6"              # packaging specifier; "" means every version
        symptom = "..."; upstream = "https://..."; remedy = "one sentence"
        targets = (Target("somelib.mod", "func", aliases=("somelib:func",)),)

        def risky(self, instance, args, kwargs) -> bool: ...   # cheap check, every call
        def handle(self, call) -> Any: ...                      # only for risky calls

``handle`` runs the library through ``call.proceed()`` and asks ``self.intervene()``
before changing anything: that logs the event, raises in ``strict`` and returns
whether to apply the fix. Any error of the guard's own falls back to the library's
own behaviour; the library's and the user's exceptions pass through unchanged.
"""

from __future__ import annotations

import _thread
import os
import sys

from autograd_guard import _events, _patching, _versions
from autograd_guard._options import Option
from autograd_guard.errors import GuardError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from types import FrameType, ModuleType
    from typing import Any, ClassVar, NoReturn

    from autograd_guard._policy import Policy

__all__ = ["Call", "Guard", "GuardError", "Option", "Target"]

_OWN_DIRS: tuple[str, ...] = (os.path.dirname(os.path.abspath(__file__)) + os.sep,)


def _wrapt_dir() -> str:
    import wrapt

    return os.path.dirname(os.path.abspath(wrapt.__file__)) + os.sep


_TRACED_IDS = iter(range(1 << 62))  # names the modules of Guard.traceable copies


class Target:
    """A callable to wrap: ``module`` defines ``qualname``; ``aliases`` re-export it.

    With ``after``, nothing happens until that module is imported too (a guard for a
    library that changes another library's behaviour, such as IPEX and torch).
    """

    __slots__ = ("after", "aliases", "module", "qualname", "rule", "skip")

    def __init__(
        self,
        module: str,
        qualname: str,
        aliases: Iterable[str] = (),
        after: str | None = None,
        skip: Iterable[str] = (),
        rule: str | None = None,
    ) -> None:
        self.module = module
        self.qualname = qualname
        self.aliases = tuple(aliases)
        self.after = after
        self.skip = tuple(skip)  # more packages whose frames are not the call site
        self.rule = rule  # "policy.toml: rules[2]" for a target that a policy rule names

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}"

    def __repr__(self) -> str:
        return f"Target({str(self)!r})"


class Call:
    """One risky call in progress: its arguments, the original, and what the original did."""

    __slots__ = (
        "_callsite",
        "args",
        "has_result",
        "instance",
        "kwargs",
        "library_error",
        "result",
        "target",
        "wrapped",
    )

    def __init__(
        self,
        target: Target,
        wrapped: Callable[..., Any],
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.target = target
        self.wrapped = wrapped
        self.instance = instance
        self.args = args
        self.kwargs = kwargs
        self.has_result = False
        self.result: Any = None
        self.library_error: BaseException | None = None
        self._callsite: str | None = None

    def proceed(
        self, args: tuple[Any, ...] | None = None, kwargs: dict[str, Any] | None = None
    ) -> Any:
        """Run the original callable (with these arguments, if given)."""
        try:
            result = self.wrapped(
                *(self.args if args is None else args),
                **(self.kwargs if kwargs is None else kwargs),
            )
        except BaseException as exc:
            self.library_error = exc
            raise
        self.has_result = True
        self.result = result
        return result

    def replace(self, name: str, position: int, value: Any) -> None:
        """Pass ``value`` for this argument to ``proceed()`` (the caller's objects are kept)."""
        if name in self.kwargs or position >= len(self.args):
            self.kwargs = {**self.kwargs, name: value}
        else:
            self.args = (*self.args[:position], value, *self.args[position + 1 :])

    def argument(self, name: str, position: int, default: Any = None) -> Any:
        """An argument passed by keyword ``name`` or at ``position``."""
        if name in self.kwargs:
            return self.kwargs[name]
        if 0 <= position < len(self.args):
            return self.args[position]
        return default

    @property
    def callsite(self) -> str:
        if self._callsite is None:
            target = self.target
            self._callsite = find_callsite(target.module.partition(".")[0], *target.skip)
        return self._callsite


def find_callsite(*libraries: str) -> str:
    """``file:line`` of the code that called the wrapped function.

    Starts above the engine's wrapper frame, so a guard's own frames never count
    (wherever the guard lives), and skips wrapt and the ``libraries`` (top-level package
    names) where a caller outside them exists.
    """
    global _OWN_DIRS
    if len(_OWN_DIRS) == 1:
        _OWN_DIRS = (*_OWN_DIRS, _wrapt_dir())
    frame: FrameType | None = sys._getframe(1)
    start = frame
    while frame is not None and frame.f_code is not _WRAPPER_CODE:
        frame = frame.f_back
    frame = frame.f_back if frame is not None else start
    fallback = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_OWN_DIRS):
            package = frame.f_globals.get("__name__", "").partition(".")[0]
            if package not in libraries:
                return f"{os.path.normpath(filename)}:{frame.f_lineno}"
            if fallback is None:
                fallback = f"{os.path.normpath(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return fallback or "<unknown>"


def describe_error(exc: BaseException) -> str:
    """An exception's type and where it was raised; never its message, which can hold the
    user's data (tensor values, paths, strings)."""
    text = f"{type(exc).__module__}.{type(exc).__qualname__}"
    trace = exc.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    if trace is not None:
        code = trace.tb_frame.f_code
        where = f"{os.path.basename(code.co_filename)}:{trace.tb_lineno}"
        text += f" raised in {code.co_name} ({where})"
    return text


class Guard:
    """Base class of every guard. Subclasses declare the class attributes and ``handle``."""

    name: ClassVar[str] = ""
    distribution: ClassVar[str | tuple[str, ...] | None] = None
    affected: ClassVar[str] = ""
    symptom: ClassVar[str] = ""
    upstream: ClassVar[str] = ""
    remedy: ClassVar[str] = ""
    targets: ClassVar[tuple[Target, ...]] = ()
    options: ClassVar[dict[str, Option]] = {}
    rule_action: ClassVar[str] = ""
    rule_options: ClassVar[dict[str, Option]] = {}
    provided_by: ClassVar[str] = "autograd-guard"  # the distribution that ships the guard
    unavailable: ClassVar[str] = ""  # why a third-party guard could not be loaded

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.mode = policy.mode_for(self.name)
        self.forced = policy.guards[self.name].force
        self.config: dict[str, Any] = policy.guards[self.name].options
        self.active = True
        self.version: str | None = None
        self.installed_as: str | None = None
        self.state = "waiting for import"
        self.places: list[str] = []
        self._wrappers: dict[str, Callable[..., Any]] = {}
        self._lock = _thread.allocate_lock()

    # -- what subclasses override ----------------------------------------------------

    def watch(self) -> Iterable[Target]:
        """The callables to wrap (the declared ``targets`` unless a guard computes them)."""
        return self.targets

    def needed(self) -> bool:
        """Whether to patch at all: the installed version is affected, or the policy forces it."""
        if self.forced or not self.distribution or not self.affected:
            return True  # forced, application code, or every version of the library
        return _versions.is_affected(self.version, self.affected)

    def risky(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """A cheap test run on every call; False lets the call through untouched."""
        return True

    def check_for(self, target: Target) -> Callable[[Any, tuple[Any, ...], dict[str, Any]], bool]:
        """The ``risky`` test for ``target`` (a guard with several targets may differ)."""
        return self.risky

    def handle(self, call: Call) -> Any:
        """Deal with a risky call. Must run the library through ``call.proceed()``."""
        return call.proceed()

    # -- what guards call ------------------------------------------------------------

    def intervene(self, call: Call, action: str, event: str, **fields: Any) -> bool:
        """Report an intervention; raise in strict mode; True means: apply the fix."""
        callsite = call.callsite
        if self.mode == "strict":
            self.refuse(event, action=action, callsite=callsite, target=str(call.target), **fields)
        self.emit(event, action=action, callsite=callsite, target=str(call.target), **fields)
        return self.mode == "fix"

    def refuse(self, event: str, *, action: str, callsite: str, **fields: Any) -> NoReturn:
        """Strict mode: log ``event`` as an error and raise it, naming the remedy."""
        self.emit(event, action=action, callsite=callsite, level="error", **fields)
        raise GuardError(
            f"autograd-guard [{self.name}] at {callsite}: {event}. Remedy: {self.remedy}"
        )

    def emit(
        self,
        event: str,
        *,
        action: str,
        callsite: str,
        level: str = "warning",
        remedy: str | None = None,
        **fields: Any,
    ) -> bool:
        return _events.emit(
            event,
            guard=self.name,
            action=action,
            callsite=callsite,
            level=level,
            mode=self.mode,
            version=self.version,
            remedy=remedy or self.remedy,
            **fields,
        )

    def fail(self, stage: str, exc: BaseException) -> None:
        """The guard's own code broke: report it once; raise only in strict mode."""
        self.emit(
            f"guard error in {stage}; the library's own behaviour was kept",
            action="guard_error",
            callsite=f"{stage}:{type(exc).__name__}",
            level="error",
            error=describe_error(exc),
            remedy="a bug in the guard: please report it with this event",
        )
        if self.mode == "strict":
            raise GuardError(
                f"autograd-guard [{self.name}] failed in {stage}: {describe_error(exc)}"
            ) from exc

    # -- torch.compile and TorchScript --------------------------------------------------

    def compiled_call(
        self, target: Target, original: Callable[..., Any], proxy: Any, fullgraph: bool
    ) -> Callable[..., Any]:
        """What ``torch.compile`` traces in place of the wrapper: the guard's traceable
        remedy (``_traced``), else the guarded call run eagerly (a graph break), else,
        under ``fullgraph=True``, the original, said in one event."""
        try:
            traced = self._traced(target, original) if self.mode in ("observe", "fix") else None
        except Exception as exc:
            self.fail("compile", exc)
            traced = None
        if traced is not None:
            return traced
        if not fullgraph:
            import torch

            return torch._dynamo.disable(proxy)  # type: ignore[no-any-return, no-untyped-call]
        self.emit(
            f"{target} is traced by torch.compile(fullgraph=True), where this guard cannot "
            "run: calls inside that graph are not guarded",
            action="compiled_unguarded",
            callsite=str(target),
            target=str(target),
            remedy="compile without fullgraph=True so that the guarded call runs eagerly",
        )
        return original

    def _traced(self, target: Target, original: Callable[..., Any]) -> Callable[..., Any] | None:
        """A function ``torch.compile`` can trace that applies the remedy (None: none)."""
        return None

    @staticmethod
    def traceable(template: Callable[..., Any], **state: Any) -> Callable[..., Any]:
        """A copy of the module-level ``template`` whose global ``compiled`` holds ``state``.

        What ``_traced`` returns must not be a closure: for a method, Dynamo guards the
        traced function's closure through the wrapper, which forwards to the original's.
        """
        import types

        # Dynamo finds a traced function's globals through sys.modules[__name__].
        name = f"autograd_guard._traced_{template.__name__}_{next(_TRACED_IDS)}"
        module = types.ModuleType(name)
        module.__dict__.update(template.__globals__)
        module.__dict__.update(__name__=name, compiled=types.SimpleNamespace(**state))
        sys.modules[name] = module
        return types.FunctionType(template.__code__, module.__dict__, template.__name__)

    def compiled_remedy(self, target: Target, action: str, what: str) -> Callable[[Any], None]:
        """For ``_traced`` functions: ``torch._dynamo.comptime`` this while tracing the
        remedy, to log that it was compiled into a graph."""

        def report(_: Any = None) -> None:
            self.emit(
                f"{what} (compiled into a torch.compile graph)",
                action=action,
                callsite=f"{target} (compiled)",
                target=str(target),
            )

        return report

    def scripted(self, target: Target) -> None:
        """``torch.jit.script`` compiles the original's source, without the guard."""
        self.emit(
            f"{target} is compiled by TorchScript, where this guard cannot run: calls in "
            "the scripted code are not guarded",
            action="scripted_unguarded",
            callsite=str(target),
            target=str(target),
            remedy="leave the guarded function out of torch.jit.script (torch.jit.ignore)",
        )

    # -- what the engine calls -------------------------------------------------------

    def attach(self, module: ModuleType, target: Target, late: bool) -> None:
        """Called once ``target.module`` is imported: gate on the version, then patch."""
        if self.distribution:
            self.installed_as, self.version = _versions.first_installed(self.distribution)
        if not self.needed():
            self.state = f"not needed for {self.installed_as} {self.version}"
            return
        try:
            patched = _patching.wrap(
                module, target.qualname, self._wrapper_for(target), target.aliases, late
            )
        except (AttributeError, _patching.NotCallableTarget) as exc:
            self._untouched(module, target, exc)
            return
        if patched is None:
            return
        self.state = "patched"
        self.places += patched.places
        if late and len(patched.places) > 1:
            self.emit(
                "target was imported before the guard; its references were updated",
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
        self.state = f"target {target} not patched: {found}"
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

    def _wrapper_for(self, target: Target) -> Callable[..., Any]:
        key = str(target)
        with self._lock:
            wrapper = self._wrappers.get(key)
            if wrapper is None:
                wrapper = self._wrappers[key] = self._make_wrapper(target)
        return wrapper

    def _make_wrapper(self, target: Target) -> Callable[..., Any]:
        risky = self.check_for(target)
        always = getattr(risky, "__func__", None) is Guard.risky  # no check to run
        handle = self.handle

        def autograd_guard_wrapper(
            wrapped: Callable[..., Any],
            instance: Any,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
        ) -> Any:
            # The library runs outside every try of ours: its exceptions, and the user's,
            # pass through as the same objects with the same context, and it runs once.
            if not self.active:
                return wrapped(*args, **kwargs)
            if not always:
                try:
                    is_risky = risky(instance, args, kwargs)
                except Exception as exc:  # fail open: run the library untouched
                    self.fail("check", exc)
                    is_risky = False
                if not is_risky:
                    return wrapped(*args, **kwargs)
            call = Call(target, wrapped, instance, args, kwargs)
            try:
                return handle(call)
            except GuardError:
                raise
            except Exception as exc:
                if exc is call.library_error:
                    raise  # the library's or the user's own exception, unchanged
                self.fail("remedy", exc)
            # The guard broke: the library's own outcome, raised or returned outside the
            # except block so that nothing of the guard's failure is chained to it.
            if call.library_error is not None:
                raise call.library_error
            if call.has_result:
                return call.result
            return wrapped(*args, **kwargs)

        autograd_guard_wrapper._autograd_guard_owner = self.name  # type: ignore[attr-defined]
        autograd_guard_wrapper._autograd_guard_compiled = (  # type: ignore[attr-defined]
            lambda original, proxy, fullgraph: self.compiled_call(
                target, original, proxy, fullgraph
            )
        )
        autograd_guard_wrapper._autograd_guard_scripted = (  # type: ignore[attr-defined]
            lambda: self.scripted(target)
        )
        return autograd_guard_wrapper


# Every wrapper shares this code object; find_callsite looks for it on the stack.
_WRAPPER_CODE = Guard._make_wrapper(Guard.__new__(Guard), Target("", "")).__code__
