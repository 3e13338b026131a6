"""How grad_health skips one optimizer step without the user seeing it anywhere else.

The optimizer skips parameters whose ``.grad`` is None (as torch documents), so the
gradients are hidden from it only while it steps: after the user's step pre-hooks, before
the user's step post-hooks (torch runs the global pre-hooks first and the global post-hooks
last, so the window is made of per-optimizer hooks: the last pre-hook, the first post-hook).
An optimizer that evaluates its closure several times (LBFGS) moves the weights between
evaluations; its steps are snapshotted (weights and state) so that a step whose later
evaluation is not finite is undone whole.
"""

from __future__ import annotations

import inspect
import sys
import weakref

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_CLOSURE_AT: dict[type, int | None] = {}  # optimizer class -> position of step's closure
MULTI_EVALUATION: weakref.WeakSet[type] = weakref.WeakSet()  # classes seen re-evaluating


def params_of(optimizer: Any) -> list[Any]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def closure_of(optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, int]:
    """The closure passed to ``step`` (``args`` holds the optimizer first) and its position
    (-1: by keyword): a callable passed where the class's ``step`` signature has
    ``closure``; (None, -1) where there is none."""
    kind = type(optimizer)
    try:
        position = _CLOSURE_AT[kind]
    except KeyError:
        position = _CLOSURE_AT[kind] = _closure_position(kind)
    if position is None:
        return None, -1
    if "closure" in kwargs:
        closure, position = kwargs["closure"], -1
    elif 0 < position < len(args):
        closure = args[position]
    else:
        return None, -1
    return (closure, position) if callable(closure) else (None, -1)


def _closure_position(kind: type) -> int | None:
    """-1: by keyword only; None: ``step`` takes no ``closure``."""
    try:
        parameters = list(inspect.signature(kind.step).parameters.values())  # type: ignore[attr-defined]
    except (TypeError, ValueError, AttributeError):
        return None
    for index, parameter in enumerate(parameters):
        if parameter.name == "closure" and parameter.kind != parameter.VAR_KEYWORD:
            positional = parameter.kind in (
                parameter.POSITIONAL_ONLY,
                parameter.POSITIONAL_OR_KEYWORD,
            )
            return index if positional else -1
    return None


def with_closure(
    args: tuple[Any, ...], kwargs: dict[str, Any], closure: Any, position: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` with ``closure`` where the original one was passed."""
    if position < 0:
        return args, {**kwargs, "closure": closure}
    return (*args[:position], closure, *args[position + 1 :]), kwargs


def evaluates_repeatedly(optimizer: Any) -> bool:
    """Its closure runs several times per step (LBFGS, or seen doing so)."""
    lbfgs = getattr(sys.modules["torch"].optim, "LBFGS", None)
    return type(optimizer) in MULTI_EVALUATION or (
        lbfgs is not None and isinstance(optimizer, lbfgs)
    )


class Snapshot:
    """The weights and optimizer state before a step, to undo it whole."""

    def __init__(self, optimizer: Any) -> None:
        torch = sys.modules["torch"]
        self.optimizer = optimizer
        self.params = params_of(optimizer)
        with torch.no_grad():
            self.weights = [p.detach().clone() for p in self.params]
        state = optimizer.state
        self.state = {id(p): _copy(state[p]) for p in self.params if p in state}

    def restore(self) -> None:
        torch = sys.modules["torch"]
        with torch.no_grad():
            for param, weight in zip(self.params, self.weights, strict=True):
                param.copy_(weight)
        state = self.optimizer.state
        for param in self.params:
            saved = self.state.get(id(param))
            if saved is None:
                state.pop(param, None)
            else:  # in place: an optimizer may hold on to its state dict (LBFGS does)
                current = state[param]
                current.clear()
                current.update(saved)


def _copy(value: Any) -> Any:
    torch = sys.modules["torch"]
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(v) for v in value)
    return value  # numbers, strings, None: immutable


class SkipWindow:
    """One skipped step: the gradients are kept from the optimizer while it steps and
    given back before the user's step post-hooks; a snapshot, if any, is restored then."""

    def __init__(self, params: list[Any], snapshot: Snapshot | None) -> None:
        self.saved = [(p, p.grad) for p in params if p.grad is not None]
        self.params = params
        self.snapshot = snapshot
        self.handles: list[Any] = []
        self.restored = False

    def hide(self, *_: Any) -> None:
        for param in self.params:
            param.grad = None

    def restore(self, *_: Any) -> None:
        if self.restored:
            return
        self.restored = True
        if self.snapshot is not None:
            self.snapshot.restore()
        for param, grad in self.saved:
            param.grad = grad

    def attach(self, optimizer: Any, eager: Callable[[Any], Any], hide: bool) -> None:
        """Hide as the last step pre-hook (``hide``), restore as the first post-hook. Only
        from a global pre-hook or inside the step, where no per-optimizer hook dict is
        being iterated."""
        if hide:
            self.handles.append(optimizer.register_step_pre_hook(eager(self.hide)))
        handle = optimizer.register_step_post_hook(eager(self.restore))
        self.handles.append(handle)
        _move_first(handle)

    def detach(self) -> None:
        """Remove the hooks (from a global hook, once torch has iterated the optimizer's)."""
        for handle in self.handles:
            handle.remove()
        self.handles = []


def _move_first(handle: Any) -> None:
    hooks = handle.hooks_dict_ref()
    if hooks is None:
        return
    if hasattr(hooks, "move_to_end"):
        hooks.move_to_end(handle.id, last=False)
    else:  # a plain dict keeps insertion order: rebuild it in place
        items = list(hooks.items())
        hooks.clear()
        hooks.update(sorted(items, key=lambda item: item[0] != handle.id))
