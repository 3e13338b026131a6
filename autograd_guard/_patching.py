"""Wrap attributes with wrapt, fix up re-exports, and undo it all on request."""

from __future__ import annotations

import _thread
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]

_lock = _thread.RLock()
# (owner, attribute, original, replacement); applied in order, undone in reverse.
_applied: list[tuple[object, str, object, object]] = []


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork time would never be released in the child.
    global _lock
    _lock = _thread.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class NotCallableTarget(TypeError):
    """The target names a value that is not a function (``math:pi``): left untouched."""


class Patched:
    """What one ``wrap`` call did: every place the wrapper was put."""

    def __init__(self) -> None:
        self.places: list[str] = []


_function_wrapper: Any = None


def function_wrapper_type() -> Any:
    """``wrapt.FunctionWrapper`` that pickles and copies exactly like the original.

    A bare wrapt proxy refuses ``pickle`` ("object proxy must define __reduce_ex__()"),
    which breaks ``multiprocessing``, ``torch.save`` and ``deepcopy`` of anything that
    holds a guarded function. A function pickles by reference (module and qualified
    name), and unpickling that reference finds the wrapper again; a bound method pickles
    as ``getattr(instance, name)``. Copies of a function are the function itself.
    """
    global _function_wrapper
    if _function_wrapper is None:
        import wrapt

        class GuardedBoundFunction(wrapt.BoundFunctionWrapper):  # type: ignore[misc, type-arg]
            def __reduce_ex__(self, protocol: Any) -> Any:
                return self.__wrapped__.__reduce_ex__(protocol)

            def __copy__(self) -> Any:
                return self

            def __deepcopy__(self, memo: Any) -> Any:
                return self

        class GuardedFunction(wrapt.FunctionWrapper):  # type: ignore[misc, type-arg]
            __bound_function_wrapper__ = GuardedBoundFunction

            def __init__(self, wrapped: Any, wrapper: Any) -> None:
                super().__init__(wrapped, wrapper)
                self._self_compiled: dict[bool, Any] = {}

            @property
            def _torchdynamo_inline(self) -> Any:
                # torch.compile traces this function in place of the wrapper (a wrapt
                # proxy passes for the original function, whose code Dynamo would trace
                # past the guard). Read at every guard check: cached per fullgraph.
                fullgraph = _dynamo_fullgraph()
                inline = self._self_compiled.get(fullgraph)
                if inline is None:
                    owner = getattr(self._self_wrapper, "_autograd_guard_compiled", None)
                    inline = owner(self.__wrapped__, self, fullgraph) if owner else None
                    inline = self._self_compiled[fullgraph] = inline or self.__wrapped__
                return inline

            @property
            def _torchscript_modifier(self) -> Any:
                # torch.jit.script compiles the original's source: say so, once.
                report = getattr(self._self_wrapper, "_autograd_guard_scripted", None)
                if report is not None:
                    report()
                import torch

                return torch._jit_internal.FunctionModifiers.DEFAULT

            def __reduce_ex__(self, protocol: Any) -> Any:
                return self.__wrapped__.__qualname__

            def __copy__(self) -> Any:
                return self

            def __deepcopy__(self, memo: Any) -> Any:
                return self

        _function_wrapper = GuardedFunction
    return _function_wrapper


def wrap(
    module: object,
    qualname: str,
    wrapper: Wrapper,
    aliases: Iterable[str] = (),
    scan_modules: bool = False,
) -> Patched | None:
    """Replace ``module.<qualname>`` by a ``wrapt.FunctionWrapper``; idempotent.

    ``aliases`` are ``"module:name"`` re-export spots to update when they still hold
    the original. With ``scan_modules``, every module in ``sys.modules`` is searched
    for stale references too (for a target that was imported before the guard).
    Returns None when the attribute already carries this guard's wrapper.
    """
    import wrapt

    with _lock:
        parent, attribute, original = wrapt.resolve_path(module, qualname)
        if _is_ours(getattr(original, "fget", original), wrapper):
            return None
        function_wrapper = _replacement(original, wrapper)
        result = Patched()
        _set(parent, attribute, original, function_wrapper)
        result.places.append(f"{getattr(module, '__name__', module)}:{qualname}")
        for alias in aliases:
            name, _, attr = alias.partition(":")
            owner = sys.modules.get(name)
            if owner is not None and getattr(owner, attr, None) is original:
                _set(owner, attr, original, function_wrapper)
                result.places.append(alias)
        if scan_modules:
            result.places += _replace_everywhere(original, function_wrapper)
        return result


def _dynamo_fullgraph() -> bool:
    """Whether torch.compile is tracing right now with ``fullgraph=True``."""
    tracing = sys.modules.get("torch._dynamo.symbolic_convert")
    current = getattr(getattr(tracing, "tls", None), "current_tx", None)
    return bool(
        getattr(current, "one_graph", False) or getattr(current, "error_on_graph_break", False)
    )


def _replacement(original: object, wrapper: Wrapper) -> object:
    """The wrapped function; a property gets its getter wrapped, as its callable part."""
    if isinstance(original, property):
        if original.fget is None:
            raise NotCallableTarget("a property without a getter")
        getter = function_wrapper_type()(original.fget, wrapper)
        return property(getter, original.fset, original.fdel, original.__doc__)
    if not callable(original) or isinstance(original, type):
        kind = type(original).__name__
        article = "an" if kind[:1] in "aeiou" else "a"
        raise NotCallableTarget(f"{article} {kind}, not a function")
    return function_wrapper_type()(original, wrapper)


def _is_ours(obj: object, wrapper: Wrapper) -> bool:
    """Already wrapped by the same guard (one function can be reached by two targets)."""
    current = getattr(obj, "_self_wrapper", None)
    owner = getattr(wrapper, "_autograd_guard_owner", None)
    return current is wrapper or (
        owner is not None and getattr(current, "_autograd_guard_owner", None) == owner
    )


def _set(owner: object, attribute: str, original: object, replacement: object) -> None:
    setattr(owner, attribute, replacement)
    _applied.append((owner, attribute, original, replacement))


def _replace_everywhere(original: object, replacement: object) -> list[str]:
    """Point stale ``from x import f`` references, made before the guard, at the wrapper.

    Only names equal to the function's own name are touched: a reference kept under
    another name (``original = f``) is the caller's on purpose.
    """
    key = getattr(original, "__name__", None)
    places: list[str] = []
    if not isinstance(key, str):
        return places
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and namespace.get(key) is original:
            _set(module, key, original, replacement)
            places.append(f"{name}:{key}")
    return places


def undo_all() -> list[str]:
    """Restore every original object; returns the places that someone else re-patched."""
    skipped = []
    with _lock:
        while _applied:
            owner, attribute, original, replacement = _applied.pop()
            current = (
                owner.__dict__.get(attribute)
                if isinstance(owner, type)
                else getattr(owner, attribute, None)
            )
            if current is replacement:
                setattr(owner, attribute, original)
            else:
                skipped.append(f"{getattr(owner, '__name__', owner)}.{attribute}")
    return skipped
