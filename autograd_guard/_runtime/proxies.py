"""The proxies put in place of guarded functions: ``wrapt.FunctionWrapper`` made to pickle,
copy, compile and script exactly like the original.

A bare wrapt proxy refuses ``pickle`` ("object proxy must define __reduce_ex__()"), which
breaks ``multiprocessing``, ``torch.save`` and ``deepcopy`` of anything that holds a
guarded function. A function pickles by reference (module and the name that holds it), and
unpickling that reference finds the wrapper again; a bound method pickles as
``getattr(instance, name)``, one reached through its class (or a static method) as
``getattr(cls, name)``. Copies of a function are the function itself. Imported only when
something is patched: wrapt costs ~65 ms without torch.

A guarded function binds as a function does: ``obj.method`` is a real bound method
(``types.MethodType``) whose ``__func__`` is the class's proxy, so it is what users and
libraries expect wherever they put it (``weakref.WeakMethod``, ``inspect.ismethod``, a
``partial``, a list of callbacks), and torch.compile traces it as a bound method,
through the proxy's ``_torchdynamo_inline``, even when it is held as a value. A method's
proxy, called with the instance first, hands the guard that instance, as a call through
the class does.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from types import FunctionType, MethodType
from typing import Any

import wrapt

from autograd_guard._compile import compiled as _compiled
from autograd_guard._compile.compiled import dynamo_tracing
from autograd_guard._compile.dynamo_frames import (
    DYNAMO,
    region_callback,
    restore,
    skipped,
    skipped_methods,
)


@skipped_methods  # run eagerly in compiled regions, never compiled
class _CopiedAsItself:
    """Copies of a function are the function itself."""

    __slots__ = ()  # no __dict__ descriptor of its own in front of the proxy's

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: Any) -> Any:
        return self


@skipped_methods  # run eagerly in compiled regions, never compiled
class GuardedBoundFunction(_CopiedAsItself, wrapt.BoundFunctionWrapper):  # type: ignore[misc, type-arg]
    """What a guarded function binds to, made by wrapt's (C) ``__get__`` through the class
    attribute wrapt provides for it (``FunctionWrapper.__bound_function_wrapper__``)."""

    @skipped  # a static method: skipped_methods sees no code of its own
    def __new__(
        cls,
        descriptor: Any,
        instance: Any,
        wrapper: Any,
        enabled: Any,
        binding: str,
        parent: Any,
        owner: Any = None,  # not passed for ``Class.method.__get__(obj)``
    ) -> Any:
        """``parent`` bound as its original binds: a function to a real bound method (the
        class's attribute, unbound), anything else to this wrapt bound wrapper."""
        if type(parent.__wrapped__) is not FunctionType:
            return super().__new__(cls)  # then wrapt's __init__, with these arguments
        if DYNAMO.set_eval_frame is not None and isinstance(parent, GuardedMethod):
            # see GuardedMethod.__getattribute__ (reached through the class: no instance)
            _LAST_BOUND.ref = None if instance is None else _weak(instance)
        return parent if instance is None else MethodType(parent, instance)

    def __deepcopy__(self, memo: Any) -> Any:
        # As a bound method: the copy is bound to a copy of the instance (a model's own
        # hook, deep-copied with the model, must act on the copy).
        instance = self._self_instance
        if instance is None or self._self_binding != "function":
            return self
        import copy

        return self._self_parent.__get__(copy.deepcopy(instance, memo), type(instance))

    def __getattribute__(self, name: str) -> Any:
        if name == "_torchdynamo_inline":
            # Dynamo inlines type(obj).method, and may call it back through
            # obj.method._torchdynamo_inline at a graph break: bound to obj.
            parent, instance = self._self_parent, self._self_instance
            inline = type(parent).__dict__.get(name)
            if inline is not None and self._self_binding == "function":
                return inline if instance is None else MethodType(inline, instance)
        return super().__getattribute__(name)

    @property
    def __func__(self) -> Any:
        # As a bound method's: the class's attribute, the guarded function (torch.jit.script
        # reads its _torchscript_modifier there), not the original past it.
        if self._self_binding == "function":
            return self._self_parent
        return getattr(self.__wrapped__, "__func__")  # noqa: B009

    def __reduce_ex__(self, protocol: Any) -> Any:
        instance = self._self_instance
        if instance is None or self._self_binding == "staticmethod":
            # reached through the class: the class's attribute, as a plain function would be
            owner = instance if isinstance(instance, type) else _owner_class(self.__wrapped__)
            if owner is not None:
                return getattr, (owner, self.__wrapped__.__name__)
        return self.__wrapped__.__reduce_ex__(protocol)


@skipped_methods  # run eagerly in compiled regions, never compiled
class GuardedFunction(_CopiedAsItself, wrapt.FunctionWrapper):  # type: ignore[misc, type-arg]
    """Made by ``guarded_function``: each guarded target gets a subclass of its own, whose
    ``_torchdynamo_inline`` class attribute is what torch.compile traces in its place."""

    # What wrapt's own (C) __get__ makes to bind: a real bound method (see the module's
    # docstring and GuardedBoundFunction.__new__). The descriptor stays wrapt's:
    # torch.compile does not trace it.
    __bound_function_wrapper__ = GuardedBoundFunction

    def __getattribute__(self, name: str) -> Any:
        if name == "_torchdynamo_inline":
            # The plain function, never bound to the proxy: Dynamo reads it both ways
            # (inspect.getattr_static and getattr) across torch versions.
            inline = type(self).__dict__.get(name)
            if inline is not None:
                return inline
        return super().__getattribute__(name)

    @property
    def _torchscript_modifier(self) -> Any:
        # torch.jit.ignore/unused/export set this on the function: follow the original's.
        modifier = getattr(self.__wrapped__, "_torchscript_modifier", None)
        if modifier is not None:
            return modifier
        report = getattr(self._self_wrapper, "_autograd_guard_scripted", None)
        if report is not None:
            report()  # torch.jit.script compiles the original's source: say so, once
        import torch

        return torch._jit_internal.FunctionModifiers.DEFAULT

    @_torchscript_modifier.setter
    def _torchscript_modifier(self, value: Any) -> None:
        setattr(self.__wrapped__, "_torchscript_modifier", value)  # noqa: B010

    def __reduce_ex__(self, protocol: Any) -> Any:
        return _name_holding(self)


@skipped_methods  # run eagerly in compiled regions, never compiled
class GuardedMethod(GuardedFunction):
    """The proxy of a function a class holds (an instance method): called with the
    instance first (``obj.method(x)`` through the bound method, or ``Cls.method(obj, x)``),
    the guard gets the instance and the other arguments, and the original bound to it."""

    def __getattribute__(self, name: str) -> Any:
        if name == "_torchdynamo_inline":
            # torch.compile traces ``obj.method`` as the class's inline bound to obj, and
            # at a graph break calls ``obj.method._torchdynamo_inline`` (a real bound
            # method hands this proxy no instance): bound to the instance of the
            # ``obj.method`` just evaluated on this thread, as while tracing it is not.
            inline = type(self).__dict__.get(name)
            ref = getattr(_LAST_BOUND, "ref", None)
            instance = None if ref is None else ref()
            if inline is not None and instance is not None:
                _LAST_BOUND.ref = None
                if not dynamo_tracing():
                    return MethodType(inline, instance)
        return super().__getattribute__(name)

    # the original, the guard's wrapper, its switch (see _common.call.Target)
    _method_parts: tuple[Any, Any, Any] = (None, None, None)

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        original, wrapper, switch = type(self)._method_parts  # no lookup on the proxy
        if switch is not None and not switch:
            return original(*args, **kwargs)  # as wrapt's __call__ does for a function
        if args:
            instance, args = args[0], args[1:]
        else:  # the instance by keyword (``Cls.method(self=obj, x=1)``), or none at all
            first = original.__code__.co_varnames[: original.__code__.co_argcount][:1]
            if not first or first[0] not in kwargs:
                return original(**kwargs)  # raises as it would unguarded
            kwargs = dict(kwargs)
            instance = kwargs.pop(first[0])
        return wrapper(original.__get__(instance, type(instance)), instance, args, kwargs)


_LAST_BOUND = threading.local()  # .ref: to the obj of the last guarded obj.method


@skipped  # called by a proxy's methods, which run eagerly in compiled regions
def _weak(instance: Any) -> Callable[[], Any] | None:
    """A weak reference to ``instance``; one that takes none (``__slots__`` without
    ``__weakref__``) is held only inside a compiled region, where a rebuilt call may need
    it, never by eager code (an object is never kept alive past its last use there)."""
    try:
        return weakref.ref(instance)
    except TypeError:
        callback = region_callback()  # unsets it: set again below
        if callback is None:
            return None
        restore(callback)
        return lambda: instance


def guarded_function(original: Any, wrapper: Any, method: bool = False) -> GuardedFunction:
    """``original`` wrapped by ``wrapper``, in a proxy type of its own; ``method``: an
    instance method's function (see ``GuardedMethod``)."""
    inline = None
    make_inline = getattr(wrapper, "_autograd_guard_inline", None)
    if make_inline is not None:
        inline = make_inline(original)
    namespace: dict[str, Any] = {"_torchdynamo_inline": inline} if inline is not None else {}
    # wrapt's `enabled`: while false, wrapt's own __call__ calls the original directly
    switch = getattr(wrapper, "_autograd_guard_switch", None)
    if method:
        namespace["_method_parts"] = (original, wrapper, switch)
    base = GuardedMethod if method else GuardedFunction
    kind = type(base.__name__, (base,), namespace)
    proxy: GuardedFunction = kind(original, wrapper, switch)
    if inline is not None:
        _compiled.bind_proxy(inline, proxy)
    return proxy


def _name_holding(proxy: Any) -> str:
    """The name that holds ``proxy`` in its function's module (an alias if need be)."""
    wrapped = proxy.__wrapped__
    qualname = getattr(wrapped, "__qualname__", None) or wrapped.__name__
    module = sys.modules.get(getattr(wrapped, "__module__", None) or "")
    found: Any = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not proxy and module is not None:
        for name, value in list(vars(module).items()):
            if value is proxy:
                return name
    return str(qualname)


def _owner_class(function: Any) -> Any:
    """The class whose attribute ``function`` is, found from its qualified name."""
    owner: Any = sys.modules.get(getattr(function, "__module__", None) or "")
    parts = getattr(function, "__qualname__", "").split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
    return owner if isinstance(owner, type) else None
