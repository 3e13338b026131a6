"""The pieces of one optimizer step that grad_health reads: its parameters, the closure
passed to ``step`` and where, and a snapshot to undo a step whole.

A step with a closure computes its gradients inside the step body. torch's own optimizers
evaluate the closure before they change anything; LBFGS evaluates it again after moving
the weights, and a third-party optimizer may move them before (SAM's first step). Those
steps are snapshotted (weights, state and ``param_groups``) so that a step whose
evaluation is not finite is undone whole.
"""

from __future__ import annotations

import inspect
import sys
import weakref

TYPE_CHECKING = False
if TYPE_CHECKING:
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


def evaluates_first(optimizer: Any) -> bool:
    """Its step evaluates the closure once, before it changes anything: torch's own
    optimizers but LBFGS (and none seen doing otherwise)."""
    kind = type(optimizer)
    if kind in MULTI_EVALUATION or not kind.__module__.startswith("torch.optim."):
        return False
    lbfgs = getattr(sys.modules["torch"].optim, "LBFGS", None)
    return lbfgs is None or not isinstance(optimizer, lbfgs)


class Snapshot:
    """Everything a step may change, before it, to undo it whole: the weights, and of the
    optimizer and every optimizer it holds (SAM's base, Lookahead's inner), ``state``,
    ``param_groups`` settings and plain attributes (counters)."""

    def __init__(self, optimizer: Any) -> None:
        torch = sys.modules["torch"]
        self.parts = [_Part(o) for o in _optimizers_in(optimizer, torch.optim.Optimizer)]
        seen: dict[int, Any] = {}
        for part in self.parts:
            seen.update((id(p), p) for p in part.params)
        self.params = list(seen.values())
        with torch.no_grad():
            self.weights = [p.detach().clone() for p in self.params]

    def restore(self) -> None:
        torch = sys.modules["torch"]
        with torch.no_grad():
            for param, weight in zip(self.params, self.weights, strict=True):
                param.copy_(weight)
        for part in self.parts:
            part.restore()


class _Part:
    """One optimizer's state, settings and plain attributes."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer
        self.params = params_of(optimizer)
        state = optimizer.state
        self.state = {id(p): _copy(state[p]) for p in self.params if p in state}
        self.groups = [
            {k: _copy(v) for k, v in group.items() if k != "params"}
            for group in optimizer.param_groups
        ]
        self.attributes = _plain(optimizer)

    def restore(self) -> None:
        state = self.optimizer.state
        for param in self.params:
            saved = self.state.get(id(param))
            if saved is None:
                state.pop(param, None)
            else:  # in place: an optimizer may hold on to its state dict (LBFGS does)
                current = state[param]
                current.clear()
                current.update(saved)
        for group, saved_group in zip(self.optimizer.param_groups, self.groups, strict=False):
            for key in [k for k in group if k != "params" and k not in saved_group]:
                del group[key]
            group.update(saved_group)
        attributes = vars(self.optimizer)
        for key in [k for k in _plain(self.optimizer) if k not in self.attributes]:
            del attributes[key]
        attributes.update(self.attributes)


def _plain(optimizer: Any) -> dict[str, Any]:
    return {
        k: v
        for k, v in vars(optimizer).items()
        if isinstance(v, (int, float, bool, str, type(None)))
    }


def _optimizers_in(optimizer: Any, kind: type) -> list[Any]:
    """``optimizer`` and the optimizers its attributes hold, at any depth."""
    found: list[Any] = []
    todo = [optimizer]
    while todo:
        current = todo.pop()
        if any(current is known for known in found):
            continue
        found.append(current)
        todo += [v for v in vars(current).values() if isinstance(v, kind)]
    return found


def _copy(value: Any) -> Any:
    torch = sys.modules["torch"]
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(v) for v in value)
    return value  # numbers, strings, None: immutable
