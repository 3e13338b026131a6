"""Wrap attributes with wrapt, fix up re-exports, and undo it all on request."""

from __future__ import annotations

import sys
from types import FunctionType

from autograd_guard._common import STATE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any

    Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]


class NotCallableTarget(TypeError):
    """The target names a value that is not a function (``math:pi``): left untouched."""


class Patched:
    """What one ``wrap`` call did: every place the wrapper was put."""

    def __init__(self) -> None:
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

    with STATE.patch_lock:
        parent, attribute, original = wrapt.resolve_path(module, qualname)
        if _is_ours(_callable_part(original), wrapper):
            return None
        function_wrapper = _replacement(original, wrapper, isinstance(parent, type))
        result = Patched()
        _set(parent, attribute, original, function_wrapper)
        result.places.append(f"{getattr(module, '__name__', module)}:{qualname}")
        result.places += _replace_module_aliases(parent, attribute, original, function_wrapper)
        for alias in aliases:
            name, _, attr = alias.partition(":")
            owner = sys.modules.get(name)
            if owner is not None and getattr(owner, attr, None) is original:
                _set(owner, attr, original, function_wrapper)
                result.places.append(alias)
        if scan_modules:
            result.places += _replace_everywhere(original, function_wrapper)
        return result


def _guarded_function(original: object, wrapper: Wrapper, method: bool = False) -> Any:
    from autograd_guard._runtime.proxies import (
        guarded_function,  # imports wrapt: only when patching
    )

    return guarded_function(original, wrapper, method)


def _replacement(original: object, wrapper: Wrapper, in_class: bool = False) -> object:
    """The wrapped function; a property gets its getter wrapped, a staticmethod or a
    classmethod its function, so that what the class holds is still a real descriptor of
    the same kind (torch.compile reads its ``__func__``, and would trace the original
    past a proxy that only passes for one). A function held by a class (``in_class``) is
    an instance method: its proxy binds to a real bound method (see ``_runtime.proxies``)."""
    if isinstance(original, property):
        if original.fget is None:
            raise NotCallableTarget("a property without a getter")
        getter = _guarded_function(original.fget, wrapper)
        return property(getter, original.fset, original.fdel, original.__doc__)
    if _plain_method_descriptor(original):
        function = _guarded_function(original.__func__, wrapper)  # type: ignore[attr-defined]
        if isinstance(original, classmethod):
            from autograd_guard._compile.dynamo_frames import guarded_classmethod

            guarded_classmethod(type(function))
        return type(original)(function)  # type: ignore[call-arg]
    # A subclass (its own state, __set_name__) or a classmethod of a descriptor (Python
    # < 3.13) is wrapped as itself.
    if not (callable(original) or isinstance(original, classmethod)) or isinstance(original, type):
        kind = type(original).__name__
        article = "an" if kind[:1] in "aeiou" else "a"
        raise NotCallableTarget(f"{article} {kind}, not a function")
    return _guarded_function(original, wrapper, in_class and isinstance(original, FunctionType))


def _callable_part(obj: object) -> object:
    """What a guard's wrapper wraps in ``obj``: a property's getter, a static or class
    method's function, else ``obj`` itself."""
    if isinstance(obj, property):
        return obj.fget
    if _plain_method_descriptor(obj):
        return obj.__func__  # type: ignore[attr-defined]
    return obj


def _plain_method_descriptor(obj: object) -> bool:
    """A ``staticmethod`` or ``classmethod`` itself (not a subclass, which may hold state
    of its own) around a function."""
    return type(obj) in (staticmethod, classmethod) and callable(obj.__func__)  # type: ignore[attr-defined]


def _is_ours(obj: object, wrapper: Wrapper) -> bool:
    """Already wrapped by the same guard (one function can be reached by two targets)."""
    current = getattr(obj, "_self_wrapper", None)
    owner = getattr(wrapper, "_autograd_guard_owner", None)
    return current is wrapper or (
        owner is not None and getattr(current, "_autograd_guard_owner", None) == owner
    )


# Stands for the original of an attribute that its owner did not hold itself: a class
# attribute the class inherited, a method an instance gets from its class, an attribute
# a module's ``__getattr__`` makes. Undone by deleting it, so that what it came from shows
# through again (and later patches there are not hidden behind a copy on the owner).
INHERITED = object()


def _set(owner: object, attribute: str, original: object, replacement: object) -> None:
    own = _own_attributes(owner)
    if own is not None and attribute not in own:
        original = INHERITED
    setattr(owner, attribute, replacement)
    STATE.applied.append((owner, attribute, original, replacement))


def _replace_module_aliases(
    parent: object, attribute: str, original: object, replacement: object
) -> list[str]:
    """The target's module exports the same function under another name too (``fit =
    _fit_impl``): that name is guarded as well, so that either pickles by reference."""
    namespace = getattr(parent, "__dict__", None)
    if not isinstance(parent, type(sys)) or not isinstance(namespace, dict):
        return []
    places = []
    for name, value in list(namespace.items()):
        if value is original and name != attribute:
            _set(parent, name, original, replacement)
            places.append(f"{parent.__name__}:{name}")
    return places


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


def _own_attributes(owner: object) -> Mapping[str, object] | None:
    """What ``owner`` holds itself (its ``__dict__``); None where it has none."""
    try:
        return vars(owner)
    except TypeError:  # __slots__
        return None


def undo_all() -> list[str]:
    """Restore every original object; returns the places that someone else re-patched."""
    skipped = []
    with STATE.patch_lock:
        # what each wrapper replaced, to find the copies an import made of a wrapper
        replaced = {id(r): o for _, _, o, r in STATE.applied if o is not INHERITED}
        wrappers = [r for _, _, _, r in STATE.applied]
        packages = {_package(owner) for owner, _, _, _ in STATE.applied}
        while STATE.applied:
            owner, attribute, original, replacement = STATE.applied.pop()
            own = _own_attributes(owner)
            current = getattr(owner, attribute, None) if own is None else own.get(attribute)
            if current is replacement and original is INHERITED:
                delattr(owner, attribute)
            elif current is replacement:
                setattr(owner, attribute, original)
            else:
                skipped.append(f"{getattr(owner, '__name__', owner)}.{attribute}")
        _restore_copies(wrappers, replaced, packages)
    return skipped


def _package(owner: object) -> str:
    name = owner.__name__ if isinstance(owner, type(sys)) else getattr(owner, "__module__", "")
    return str(name).partition(".")[0]


def _restore_copies(
    wrappers: list[object], replaced: dict[int, object], packages: set[str]
) -> None:
    """A module that imported a wrapper while its package was being imported (a hook ran
    on ``warp.context`` before ``warp/__init__`` did ``from warp.context import launch``)
    holds a copy the patcher never set: it gets the original back too. Only the modules
    of the patched packages are looked at, and only their names that hold a wrapper."""
    ours = {id(w) for w in wrappers}
    if not ours:
        return
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] not in packages:
            continue
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attribute, value in list(namespace.items()):
            if id(value) in ours:
                original = value
                while id(original) in replaced:  # a wrapper of a wrapper: down to the library's
                    original = replaced[id(original)]
                if original is not value and id(original) not in ours:
                    namespace[attribute] = original
