"""Generators and coroutines run their body at each resume, not at the call: to give the
body a context (grad on), it must be entered at every ``next``/``send``/``throw``/``await``
and left before control goes back to the caller, whose own modes hold in between."""

from __future__ import annotations

from autograd_guard._compile import dynamo_frames as _dynamo_frames
from autograd_guard._compile.dynamo_frames import skipped_methods

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Generator
    from typing import Any


def resume_each_time_under(kind: str, inner: Any, context: Callable[[], Any]) -> Any:
    """``inner`` (a ``generator``, ``coroutine`` or ``asyncgen``), driven so that each
    resume runs inside ``context()``; the same kind of object is returned."""
    if kind == "asyncgen":
        return _async_generator(inner, context)
    driven = _drive(inner, context)
    return _await(driven) if kind == "coroutine" else driven


class GradModes:
    """``inference_mode(False)`` and ``enable_grad()`` for one resume."""

    __slots__ = ("_grad", "_inference")

    def __init__(self, torch: Any) -> None:
        self._inference = torch.inference_mode(False)
        self._grad = torch.enable_grad()

    def __enter__(self) -> None:
        self._inference.__enter__()
        self._grad.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._grad.__exit__(*exc)
        self._inference.__exit__(*exc)


@skipped_methods
class _Uncompiled:
    """``modes()`` entered and left with Dynamo's callback unset (see ``_compile.dynamo_frames``):
    a generator stage resumed in a torch.compile region has its resume compiled as
    unguarded, never the guard's own code."""

    __slots__ = ("_context", "_modes")

    def __init__(self, modes: Callable[[], Any]) -> None:
        self._modes = modes

    def __enter__(self) -> None:
        callback = _dynamo_frames.unset()
        try:
            self._context = self._modes()
            self._context.__enter__()
        finally:
            _dynamo_frames.restore(callback)

    def __exit__(self, *exc: Any) -> None:
        callback = _dynamo_frames.unset()
        try:
            self._context.__exit__(*exc)
        finally:
            _dynamo_frames.restore(callback)


class _NoContext:
    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: Any) -> None:
        pass


NO_CONTEXT = _NoContext()


def _drive(inner: Any, modes: Callable[[], Any]) -> Generator[Any, Any, Any]:
    """Resume ``inner`` (a generator, coroutine or ``asend`` awaitable) under ``modes()``
    at every ``next``/``send``/``throw``; the caller's modes hold between resumes."""
    value: Any = None
    thrown: BaseException | None = None
    while True:
        with _Uncompiled(modes):
            try:
                item = inner.send(value) if thrown is None else inner.throw(thrown)
            except StopIteration as stop:
                return stop.value
        try:
            value, thrown = (yield item), None
        except GeneratorExit:
            with _Uncompiled(modes):
                inner.close()
            raise
        except BaseException as exc:  # thrown in by the caller: pass it on to the body
            value, thrown = None, exc


class _Awaitable:
    __slots__ = ("_driven",)

    def __init__(self, driven: Generator[Any, Any, Any]) -> None:
        self._driven = driven

    def __await__(self) -> Generator[Any, Any, Any]:
        return self._driven


async def _await(driven: Generator[Any, Any, Any]) -> Any:
    return await _Awaitable(driven)


async def _async_generator(inner: Any, modes: Callable[[], Any]) -> AsyncGenerator[Any, Any]:
    value: Any = None
    thrown: BaseException | None = None
    while True:
        step = inner.asend(value) if thrown is None else inner.athrow(thrown)
        try:
            item = await _Awaitable(_drive(step, modes))
        except StopAsyncIteration:
            return
        try:
            value, thrown = (yield item), None
        except GeneratorExit:
            await _Awaitable(_drive(inner.aclose(), modes))
            raise
        except BaseException as exc:
            value, thrown = None, exc


for _function in (_drive, _await, _async_generator, _Awaitable.__await__):
    _dynamo_frames.skip(_function.__code__)
