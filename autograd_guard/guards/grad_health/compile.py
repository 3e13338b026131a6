"""grad_health under ``torch.compile``: its hooks run eagerly whatever the import order,
and keep running on torch 2.1, whose first compile strips the optimizer-hook wrapper.

Eager: Dynamo traces into any Python hook that an optimizer step calls; traced, the check's
sync fails and the NaN step goes through. So the hooks are ``torch._dynamo.disable``d (a
graph break, then eager). Under the ``.pth`` auto-load, ``torch.optim.optimizer`` is
imported while ``import torch`` still runs, before ``torch._dynamo`` can be: the hooks are
registered as they are and swapped in place (same order) for their disabled forms once
``torch._dynamo`` is imported. Creating any optimizer imports it, so before any step.

Stripped: torch 2.1's ``TorchPatcher.patch`` (run by the first compile) takes ``step`` of
each torch.optim class out of the wrapper that calls the step hooks, and stops later
wrapping. Seen by its effect once it has run: each such class gets a wrapper of ours that
runs the guard's step logic around the original, undone at uninstall.
"""

from __future__ import annotations

import functools
import sys

from autograd_guard.errors import Refused, returning_refusals

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    RunStep = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]

STAND_IN = "_autograd_guard_step"  # marks a step wrapper of ours (torch 2.1 after a compile)


class EagerHooks:
    """The guard's global step hooks, registered only where a class's step has no gate
    (``gate``), disabled for Dynamo as soon as it can be imported."""

    def __init__(self) -> None:
        self.disable: Callable[[Any], Any] | None = None
        self._hooks: list[tuple[Any, Callable[..., Any]]] = []  # (handle, plain function)
        self._pending: tuple[ModuleType, Callable[..., Any], Callable[..., Any]] | None = None
        self._wrapped: list[tuple[type, Any]] = []  # (optimizer class, its step before ours)
        self._patcher: tuple[Any, Any] | None = None  # (TorchPatcher, its own patch)
        self._run_step: RunStep | None = None
        self._disabled: dict[Any, Callable[..., Any]] = {}  # function -> its disabled form

    def eager(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn if self.disable is None else self.disable(fn)

    def eager_method(self, method: Any) -> Callable[..., Any]:
        """``eager`` for a bound method, per step: making a disabled function costs more
        than a step (~50 us), so one is made per function and bound with a partial."""
        if self.disable is None:
            return method  # type: ignore[no-any-return]
        function = method.__func__
        disabled = self._disabled.get(function)
        if disabled is None:
            disabled = self._disabled[function] = self.disable(function)
        return functools.partial(disabled, method.__self__)

    def prepare(
        self, module: ModuleType, pre: Callable[..., Any], post: Callable[..., Any]
    ) -> None:
        """The hooks that ``register`` registers, where a step cannot be gated."""
        self._pending = (module, pre, post)

    def register(self) -> None:
        """torch's global step hooks, once (the steps of a class that has no gate are
        checked from them; gated classes never need them)."""
        if self._hooks or self._pending is None:
            return
        module, pre, post = self._pending
        self._hooks = [
            (module.register_optimizer_step_pre_hook(self.eager(pre)), pre),
            (module.register_optimizer_step_post_hook(self.eager(post)), post),
        ]

    def dynamo_imported(self, dynamo: ModuleType, run_step: RunStep) -> None:
        """From now on the hooks are disabled for Dynamo; torch 2.1's patcher is watched."""
        self.disable = dynamo.disable
        for handle, plain in self._hooks:
            hooks = handle.hooks_dict_ref()
            if hooks is not None and handle.id in hooks:
                hooks[handle.id] = self.disable(plain)  # same key: same place in the order
        self._run_step = run_step
        self._watch_patcher()

    def remove(self) -> None:
        for handle, _ in self._hooks:
            handle.remove()
        self._hooks = []
        self._pending = None
        for kind, step in self._wrapped:
            if getattr(kind.__dict__.get("step"), STAND_IN, False):
                setattr(kind, "step", step)  # noqa: B010
        self._wrapped = []
        self._unwatch_patcher()

    # -- torch 2.1's TorchPatcher ------------------------------------------------------

    def _watch_patcher(self) -> None:
        """Rehook right after ``TorchPatcher.patch`` first runs (at the first
        ``torch.compile``); its body runs once (``lru_cache``), so it is then put back."""
        patcher = getattr(sys.modules.get("torch._dynamo.eval_frame"), "TorchPatcher", None)
        original = getattr(patcher, "__dict__", {}).get("patch")
        if not isinstance(original, staticmethod) or self._patcher is not None:
            return
        cache_info = getattr(original.__func__, "cache_info", None)
        if cache_info is not None and cache_info().currsize:
            self.rehook()  # it ran before the guard was installed
            return

        def patch(*args: Any, **kwargs: Any) -> Any:
            try:
                return original.__func__(*args, **kwargs)
            finally:
                self.rehook()
                self._unwatch_patcher()

        patcher.patch = staticmethod(functools.wraps(original.__func__)(patch))  # type: ignore[union-attr]
        self._patcher = (patcher, original)

    def _unwatch_patcher(self) -> None:
        if self._patcher is not None:
            patcher, patch = self._patcher
            patcher.patch = patch
            self._patcher = None

    def rehook(self) -> None:
        """Wrap ``step`` of each torch.optim class whose step no longer calls the hooks:
        one that torch marked hooked (2.1's patch marks them all) with no hooked wrapper."""
        torch = sys.modules["torch"]
        run_step = self._run_step
        wrapper_code = hook_wrapper_code(torch)
        if run_step is None or wrapper_code is None:
            return
        for kind in list(vars(torch.optim).values()):
            if not isinstance(kind, type) or not issubclass(kind, torch.optim.Optimizer):
                continue
            if kind is torch.optim.Optimizer:
                continue  # its step is abstract: never hooked
            step = kind.__dict__.get("step")
            if step is None or getattr(step, STAND_IN, False) or hook_wrapper(step, wrapper_code):
                continue
            if not getattr(step, "hooked", False):  # never made yet: torch hooks it then
                continue  # (2.1's patch marks every class hooked; newer ones strip nothing)
            stepping = self.eager(returning_refusals(run_step))
            setattr(kind, "step", _step_wrapper(step, stepping))  # noqa: B010
            self._wrapped.append((kind, step))


def _step_wrapper(step: Callable[..., Any], run_step: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(step)
    def wrapper(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        result = run_step(step, optimizer, args, kwargs)
        if isinstance(result, Refused):  # strict: raised from here, the guard's one frame
            raise result.error  # autograd-guard strict: the message says why
        return result

    wrapper.hooked = True  # type: ignore[attr-defined]  # torch must not wrap it again
    setattr(wrapper, STAND_IN, True)
    return wrapper


def hook_wrapper_code(torch: Any) -> Any:
    """The code object of torch's step wrapper that calls the step hooks."""
    make = getattr(torch.optim.Optimizer, "profile_hook_step", None)
    try:
        return make(lambda *a, **k: None).__code__ if make is not None else None
    except Exception:
        return None


def hook_wrapper(step: Any, wrapper_code: Any) -> Any:
    """torch's step wrapper (the function running ``wrapper_code``) that ``step`` is, or
    wraps through decorators' ``__wrapped__``; None where it calls no hooks."""
    for _ in range(8):
        if wrapper_code is not None and getattr(step, "__code__", None) is wrapper_code:
            return step
        step = getattr(step, "__wrapped__", None)
        if step is None:
            return None
    return None
