"""The fail-open wrapper the engine puts around each target, the call it hands a guard,
and the helpers guards read arguments with.

The library runs outside every ``try`` of ours: its exceptions, and the user's, pass
through as the same objects with the same context, and it runs once. Any error of the
guard's own falls back to the library's own behaviour.
"""

from __future__ import annotations

import os

from autograd_guard import _callsite, _compiled, _dynamo_frames
from autograd_guard._callsite import find_callsite as find_callsite  # where guards find it
from autograd_guard._dynamo_frames import DYNAMO, outside
from autograd_guard._recursion import GIVE_BACK
from autograd_guard.errors import GuardError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    from autograd_guard._guard import Guard, Target


def argument(
    args: tuple[Any, ...], kwargs: dict[str, Any], name: str, position: int, default: Any = None
) -> Any:
    """An argument passed by keyword ``name`` or at ``position`` (the one way to read one,
    as dd-trace's ``get_argument_value``)."""
    if name in kwargs:
        return kwargs[name]
    if 0 <= position < len(args):
        return args[position]
    return default


def iter_tensors(value: Any, tensor: type, depth: int = 3) -> Iterator[Any]:
    """The tensors in ``value`` and in its lists, tuples and dicts, ``depth`` levels down."""
    if isinstance(value, tensor):
        yield value
    elif depth > 0 and isinstance(value, (list, tuple)):
        for item in value:
            yield from iter_tensors(item, tensor, depth - 1)
    elif depth > 0 and isinstance(value, dict):
        for item in value.values():
            yield from iter_tensors(item, tensor, depth - 1)


def map_tensors(value: Any, tensor: type, change: Callable[[Any], Any], depth: int = 3) -> Any:
    """A copy of ``value`` with ``change`` applied to each tensor, ``depth`` levels down;
    containers without a tensor come back as the same objects."""
    if isinstance(value, tensor):
        return change(value)
    if depth <= 0:
        return value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):  # not a namedtuple
        return tuple(map_tensors(v, tensor, change, depth - 1) for v in value)
    if isinstance(value, list):
        return [map_tensors(v, tensor, change, depth - 1) for v in value]
    if isinstance(value, dict):
        return {k: map_tensors(v, tensor, change, depth - 1) for k, v in value.items()}
    return value


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
        return argument(self.args, self.kwargs, name, position, default)

    @property
    def callsite(self) -> str:
        if self._callsite is None:
            target = self.target
            # A rule names the user's own code: its caller there is the call site. A
            # library's own frames lead to the user's code that called into it.
            library = () if target.rule else (target.module.partition(".")[0],)
            self._callsite = find_callsite(*library, *target.skip)
        return self._callsite


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


def make_wrapper(self: Guard, target: Target) -> Callable[..., Any]:
    """The wrapt wrapper for ``target``: the guard's check, then its ``handle``, failing
    open; for a guard that overrides ``before``, its check around the call."""
    from autograd_guard._guard import Guard

    if type(self).before is not Guard.before:
        wrapper = _checking_around(self, target)
    else:
        wrapper = _handling(self, target, self.check_for(target))
    _mark(wrapper, self, target)
    return wrapper


def _handling(
    self: Guard, target: Target, risky: Callable[[Any, tuple[Any, ...], dict[str, Any]], bool]
) -> Callable[..., Any]:
    from autograd_guard._guard import Guard

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
        set_eval_frame = DYNAMO.set_eval_frame
        if set_eval_frame is not None:  # torch._dynamo is imported
            callback = set_eval_frame(None)
            if callback is not None and callback is not False:  # run by a compiled region
                return outside(autograd_guard_wrapper, callback, wrapped, instance, args, kwargs)
            set_eval_frame(callback)
        if not always:
            try:
                is_risky = risky(instance, args, kwargs)
            except Exception as exc:  # fail open: run the library untouched
                self.fail("check", exc)
                is_risky = False
            if not is_risky:
                # Inline, not in a helper: a frame of its own would cost recursion depth.
                if GIVE_BACK is None:
                    return wrapped(*args, **kwargs)
                if getattr(GIVE_BACK.running, "call", False):
                    with GIVE_BACK:  # inside another guarded call (see _recursion)
                        return wrapped(*args, **kwargs)
                GIVE_BACK.running.call = True
                try:
                    return wrapped(*args, **kwargs)
                finally:
                    GIVE_BACK.running.call = False
        call = Call(target, wrapped, instance, args, kwargs)
        try:
            return handle(call)
        except GuardError:
            raise
        except Exception as exc:
            if exc is call.library_error:
                raise  # the library's or the user's own exception, unchanged
            self.fail("remedy", exc)
        return _library_outcome(call, args, kwargs)

    return autograd_guard_wrapper


def _library_outcome(call: Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The guard broke: the library's own outcome, raised or returned outside the except
    block so that nothing of the guard's failure is chained to it."""
    if call.library_error is not None:
        raise call.library_error
    if call.has_result:
        return call.result
    return call.wrapped(*args, **kwargs)


def _checking_around(self: Guard, target: Target) -> Callable[..., Any]:
    """``Guard.before`` runs before the call and returns what to run after it; the call
    itself runs in this frame, so that a recursive target costs one frame per level."""
    before = self.before

    def autograd_guard_check_around(
        wrapped: Callable[..., Any],
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        if not self.active:
            return wrapped(*args, **kwargs)
        set_eval_frame = DYNAMO.set_eval_frame
        if set_eval_frame is not None:  # see autograd_guard_wrapper
            callback = set_eval_frame(None)
            if callback is not None and callback is not False:
                return outside(
                    autograd_guard_check_around, callback, wrapped, instance, args, kwargs
                )
            set_eval_frame(callback)
        try:
            after = before(Call(target, wrapped, instance, args, kwargs))
        except GuardError:
            raise
        except Exception as exc:  # fail open: run the library untouched
            self.fail("check", exc)
            after = None
        if GIVE_BACK is None:
            result = wrapped(*args, **kwargs)
        elif getattr(GIVE_BACK.running, "call", False):
            with GIVE_BACK:  # inside another guarded call (see _recursion)
                result = wrapped(*args, **kwargs)
        else:
            GIVE_BACK.running.call = True
            try:
                result = wrapped(*args, **kwargs)
            finally:
                GIVE_BACK.running.call = False
        if after is not None:
            try:
                after()
            except GuardError:
                raise
            except Exception as exc:  # fail open: the library's result stands
                self.fail("remedy", exc)
        return result

    return autograd_guard_check_around


def _mark(wrapper: Any, guard: Guard, target: Target) -> None:
    """What the patcher and the proxy read off a wrapper: its guard, and what to do when
    torch.compile or TorchScript meets it (see _proxies and _compiled)."""
    wrapper._autograd_guard_owner = guard.name
    wrapper._autograd_guard_inline = lambda original: _compiled.make_inline(guard, target, original)
    wrapper._autograd_guard_scripted = _compiled.scripted_report(guard, target)


# Every wrapper shares one of these code objects: find_callsite looks for them on the
# stack, and Dynamo never compiles them.
for _code in (
    c
    for maker in (_handling, _checking_around)
    for c in maker.__code__.co_consts
    if getattr(c, "co_name", "").startswith("autograd_guard_")
):
    _callsite.WRAPPER_CODES.add(id(_code))
    _dynamo_frames.skip(_code)
