"""The fail-open wrapper the engine puts around each target (the ``Call`` it hands a
guard is in ``_common.call``).

The library runs outside every ``try`` of ours: its exceptions, and the user's, pass
through as the same objects with the same context, and it runs once. Any error of the
guard's own falls back to the library's own behaviour.
"""

from __future__ import annotations

import os

from autograd_guard._common import callsite as _callsite
from autograd_guard._common.call import Call
from autograd_guard._common.callsite import find_callsite as find_callsite  # where guards find it
from autograd_guard._compile import compiled as _compiled
from autograd_guard._compile import dynamo_frames as _dynamo_frames
from autograd_guard._compile.dynamo_frames import DYNAMO, outside, region_callback
from autograd_guard._runtime.recursion import GIVE_BACK
from autograd_guard.errors import GuardError, drop_own_frames

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Protocol

    from autograd_guard._common.call import Check, Target
    from autograd_guard._compile.checks import Guard as CompileGuard

    class Guard(CompileGuard, Protocol):
        """What a wrapper uses of its guard (``_runtime.guard.Guard``, which imports this
        module to make its wrappers, has it)."""

        def before(self, call: Call) -> Callable[[], None] | None: ...
        def handler_for(self, target: Target) -> Callable[[Call], Any]: ...
        def switch_for(self, target: Target) -> list[Any] | None: ...


def describe_error(exc: BaseException) -> str:
    """An exception's type and where it was raised; never its message, which can hold the
    user's data (tensor values, paths, strings)."""
    text = f"{type(exc).__module__}.{type(exc).__qualname__}"
    trace = exc.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    if trace is not None:
        code = trace.tb_frame.f_code
        # the module's dotted name: file names repeat (a package's __init__.py, check.py)
        module = trace.tb_frame.f_globals.get("__name__")
        if not isinstance(module, str) or module == "__main__":
            module = os.path.basename(code.co_filename)
        text += f" raised in {code.co_name} ({module}:{trace.tb_lineno})"
    return text


def make_wrapper(
    self: Guard, target: Target, around: bool, risky: Check | None
) -> Callable[..., Any]:
    """The wrapt wrapper for ``target``: the guard's ``risky`` check (None: every call is
    risky), then its ``handle``, failing open; ``around``: its ``before`` around the call."""
    wrapper = _checking_around(self, target) if around else _handling(self, target, risky)
    _mark(wrapper, self, target)
    return wrapper


def _handling(self: Guard, target: Target, risky: Check | None) -> Callable[..., Any]:
    handle = self.handler_for(target)

    def autograd_guard_wrapper(
        original: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        # The library runs outside every try of ours: its exceptions, and the user's,
        # pass through as the same objects with the same context, and it runs once.
        if not self.active:
            return original(*args, **kwargs)
        # Run by a compiled region (torch._dynamo is imported): see _compile.dynamo_frames.
        if DYNAMO.set_eval_frame is not None and (callback := region_callback()) is not None:
            try:
                return outside(autograd_guard_wrapper, callback, original, instance, args, kwargs)
            except GuardError as strict:
                drop_own_frames(strict)  # this raise adds back one: its own
                raise strict  # autograd-guard strict: the message says why
        if risky is not None:  # None: no check to run
            try:
                is_risky = risky(instance, args, kwargs)
            except Exception as exc:  # fail open: run the library untouched
                self.fail("check", exc)
                is_risky = False
            if not is_risky:
                # Inline, not in a helper: a frame of its own would cost recursion depth.
                if GIVE_BACK is None:
                    return original(*args, **kwargs)
                if getattr(GIVE_BACK.running, "call", False):
                    with GIVE_BACK:  # inside another guarded call (see _runtime.recursion)
                        return original(*args, **kwargs)
                GIVE_BACK.running.call = True
                try:
                    return original(*args, **kwargs)
                finally:
                    GIVE_BACK.running.call = False
        call = Call(target, original, instance, args, kwargs)
        try:
            return handle(call)
        except GuardError as strict:
            drop_own_frames(strict)  # this raise adds back one: its own
            raise strict  # autograd-guard strict: the message says why
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
    return call.original(*args, **kwargs)


def _checking_around(self: Guard, target: Target) -> Callable[..., Any]:
    """``Guard.before`` runs before the call and returns what to run after it; the call
    itself runs in this frame, so that a recursive target costs one frame per level."""
    before = self.before

    def autograd_guard_check_around(
        original: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if not self.active:
            return original(*args, **kwargs)
        if DYNAMO.set_eval_frame is not None and (callback := region_callback()) is not None:
            try:  # see autograd_guard_wrapper
                return outside(
                    autograd_guard_check_around, callback, original, instance, args, kwargs
                )
            except GuardError as strict:
                drop_own_frames(strict)  # this raise adds back one: its own
                raise strict  # autograd-guard strict: the message says why
        try:
            after = before(Call(target, original, instance, args, kwargs))
        except GuardError as strict:
            drop_own_frames(strict)  # this raise adds back one: its own
            raise strict  # autograd-guard strict: the message says why
        except Exception as exc:  # fail open: run the library untouched
            self.fail("check", exc)
            after = None
        if GIVE_BACK is None:
            result = original(*args, **kwargs)
        elif getattr(GIVE_BACK.running, "call", False):
            with GIVE_BACK:  # inside another guarded call (see _runtime.recursion)
                result = original(*args, **kwargs)
        else:
            GIVE_BACK.running.call = True
            try:
                result = original(*args, **kwargs)
            finally:
                GIVE_BACK.running.call = False
        if after is not None:
            try:
                after()
            except GuardError as strict:
                drop_own_frames(strict)  # this raise adds back one: its own
                raise strict  # autograd-guard strict: the message says why
            except Exception as exc:  # fail open: the library's result stands
                self.fail("remedy", exc)
        return result

    return autograd_guard_check_around


def _mark(wrapper: Any, guard: Guard, target: Target) -> None:
    """What the patcher and the proxy read off a wrapper: its guard, and what to do when
    torch.compile or TorchScript meets it (see _runtime.proxies and _compile.compiled)."""
    wrapper._autograd_guard_owner = guard.name
    wrapper._autograd_guard_switch = guard.switch_for(target)  # wrapt's `enabled` (None: on)
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
