"""Wrap attributes with wrapt, fix up re-exports, and undo it all on request."""

from __future__ import annotations

import _thread
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]

_lock = _thread.RLock()
# (owner, attribute, original, replacement); applied in order, undone in reverse.
_applied: list[tuple[object, str, object, object]] = []


class Patched:
    """What one ``wrap`` call did: the original, the wrapper, and every place it was put."""

    def __init__(self, original: object, wrapper: object) -> None:
        self.original = original
        self.wrapper = wrapper
        self.places: list[str] = []


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
        if _is_ours(original, wrapper):
            return None
        function_wrapper = wrapt.FunctionWrapper(original, wrapper)
        result = Patched(original, function_wrapper)
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
