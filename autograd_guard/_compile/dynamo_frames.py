"""The guard's own frames, kept out of torch.compile.

Code of a torch.compile region that Dynamo does not trace (the eager part of a graph
break, a function it skips such as ``nn.Module.__call__``, a frame it gave up on) runs
with Dynamo's frame callback set: each Python frame entered there is compiled as the root
of a graph of its own. A guarded call met there had Dynamo compile the guard's own frames:
graph breaks on its checks (warnings, an error with ``fullgraph=True``, as for
``torch.compile(model, fullgraph=True)`` whose ``forward`` is guarded) and the guard's
code run anew where a frame failed. So, once ``torch._dynamo`` is imported, Dynamo skips
the wrapper's frames (``skip_code``: the frame only, not what it calls), the guard's work
runs with the callback unset, and the original runs with it set again: compiled as it is
unguarded.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType, ModuleType
    from typing import Any


class _Dynamo:
    """Dynamo's frame callback, reached once ``torch._dynamo`` is imported."""

    def __init__(self) -> None:
        self.skipped: list[CodeType] = []  # code Dynamo must never compile a frame of
        self.skip_code: Callable[[CodeType], None] | None = None
        # Sets the callback, returns the one it replaces (None outside a torch.compile
        # region): read by setting in every guarded call, as torch 2.6's getter returns a
        # reference it does not own (a crash once the caller drops it).
        self.set_eval_frame: Callable[[Any], Any] | None = None
        # Proxy types of functions held by a classmethod, and whether this Dynamo can
        # inline their _torchdynamo_inline as a classmethod's function (see below).
        self.classmethod_proxies: list[type] = []
        self.classmethod_inline_works = True


DYNAMO = _Dynamo()


def skip(code: CodeType) -> None:
    """Dynamo never compiles a frame of ``code`` (the frames it calls are their own)."""
    DYNAMO.skipped.append(code)
    if DYNAMO.skip_code is not None:
        DYNAMO.skip_code(code)


def skipped(function: Callable[..., Any]) -> Callable[..., Any]:
    """``skip`` as a decorator."""
    skip(function.__code__)
    return function


def skipped_methods(cls: type) -> type:
    """``skipped`` for every function and property of ``cls``'s own namespace."""
    for value in vars(cls).values():
        for function in (value.fget, value.fset) if isinstance(value, property) else (value,):
            if hasattr(function, "__code__"):
                skipped(function)  # type: ignore[arg-type]
    return cls


def dynamo_imported(dynamo: ModuleType) -> None:
    """The post-import hook of ``torch._dynamo``: no guard frame is compiled from now on."""
    if DYNAMO.skip_code is not None:
        return
    eval_frame = sys.modules["torch"]._C._dynamo.eval_frame
    skip_code = dynamo.eval_frame.skip_code
    for code in DYNAMO.skipped:
        skip_code(code)
    DYNAMO.skip_code, DYNAMO.set_eval_frame = skip_code, eval_frame.set_eval_frame
    if not _wrapper_variable_binds(sys.modules.get("torch._dynamo.variables.functions")):
        DYNAMO.classmethod_inline_works = False
        for kind in DYNAMO.classmethod_proxies:
            without_inline(kind)


def guarded_classmethod(kind: type) -> None:
    """``kind`` is the proxy type of a function a classmethod holds."""
    DYNAMO.classmethod_proxies.append(kind)
    if not DYNAMO.classmethod_inline_works:
        without_inline(kind)


def without_inline(kind: type) -> None:
    """Where Dynamo cannot bind a wrapper variable as a classmethod's function (torch
    2.15: ``WrapperUserFunctionVariable.has_self`` raises NotImplementedError, an internal
    error of the user's compile), the guarded classmethod is traced as its original inside
    compiled code (unguarded there, as before the guard wrapped class methods as their
    functions), never a crash."""
    if "_torchdynamo_inline" in vars(kind):
        delattr(kind, "_torchdynamo_inline")


def _wrapper_variable_binds(functions: Any) -> bool:
    """False where a method variable asks its function variable ``has_self`` and the
    wrapper variable leaves it to the base class, which raises."""
    method = getattr(functions, "UserMethodVariable", None)
    variable = getattr(functions, "WrapperUserFunctionVariable", None)
    base = getattr(functions, "BaseUserFunctionVariable", None)
    if method is None or variable is None or "has_self" not in vars(method):
        return True
    return getattr(variable, "has_self", None) is not getattr(base, "has_self", None)


@skipped
def unset() -> Any:
    """Unset Dynamo's callback; returns what to ``restore``."""
    set_eval_frame = DYNAMO.set_eval_frame
    return None if set_eval_frame is None else set_eval_frame(None)


@skipped
def restore(callback: Any) -> None:
    if DYNAMO.set_eval_frame is not None:
        DYNAMO.set_eval_frame(callback)


def disabled(function: Callable[..., Any]) -> Callable[..., Any]:
    """``torch._dynamo.disable(function)`` for the guard's own per-step functions, at the
    cost of two C calls: Dynamo tracing a call to it breaks the graph there (it reads
    ``_torchdynamo_disable``, as for its own), never compiles its frame, and ``function``
    runs with the callback unset. torch's wrapper also handles export annotations and
    compile stances, none of which reach a guard's check; it costs ~2 us a call in a
    short training step. Only once ``dynamo_imported`` ran (it raises where this torch
    lacks what it needs: use torch's ``disable`` then)."""
    set_eval_frame: Any = DYNAMO.set_eval_frame
    if set_eval_frame is None:
        raise RuntimeError("torch._dynamo's frame callback is not reached yet")

    def autograd_guard_disabled(*args: Any) -> Any:
        prior = set_eval_frame(None)
        try:
            return function(*args)
        finally:
            set_eval_frame(prior)

    autograd_guard_disabled._torchdynamo_disable = True  # type: ignore[attr-defined]
    autograd_guard_disabled._torchdynamo_orig_callable = function  # type: ignore[attr-defined]
    return autograd_guard_disabled


@skipped
def region_callback() -> Any:
    """The callback of the torch.compile region that runs this call, now unset (``outside``
    sets it again); None outside a region (or in run-only mode), the callback unchanged."""
    set_eval_frame: Any = DYNAMO.set_eval_frame
    callback = set_eval_frame(None)
    if callback is None or callback is False:
        set_eval_frame(callback)
        return None
    return callback


@skipped
def outside(
    wrapper: Callable[..., Any],
    callback: Any,
    wrapped: Callable[..., Any],
    instance: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Run ``wrapper`` with Dynamo's ``callback`` unset (``region_callback`` unset it), and
    ``wrapped`` with it set; it is set again on the way out."""
    set_eval_frame: Any = DYNAMO.set_eval_frame
    try:
        return wrapper(_compiled_again(wrapped, callback), instance, args, kwargs)
    finally:
        set_eval_frame(callback)


def _compiled_again(wrapped: Callable[..., Any], callback: Any) -> Callable[..., Any]:
    set_eval_frame: Any = DYNAMO.set_eval_frame

    def original(*args: Any, **kwargs: Any) -> Any:
        set_eval_frame(callback)
        try:
            return wrapped(*args, **kwargs)
        finally:
            set_eval_frame(None)

    original.__wrapped__ = wrapped  # type: ignore[attr-defined]  # its signature, kind
    return original


# Dynamo never compiles a frame of the wrapper that ``disabled`` makes
for _code in disabled.__code__.co_consts:
    if getattr(_code, "co_name", "") == "autograd_guard_disabled":
        skip(_code)
