"""Twin runs for grad_health: the same program unguarded and guarded, from the same seed,
and what each left behind (weights, optimizer state, what the user's hooks saw), compared
bit for bit."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
from helpers import assert_attached

import autograd_guard
from autograd_guard.testing import capture_events

Outcome = dict[str, Any]


def twin(
    program: Callable[[], Outcome], policy: dict[str, Any] | None = None, canary: bool = True
) -> tuple[Outcome, Outcome, list[dict[str, Any]]]:
    """``program()`` unguarded, then guarded with ``policy``; the guarded run's events.
    The guarded run starts once grad_health is hooked into torch's optimizers; with
    ``canary``, a NaN step after it proves that the guard was on."""
    torch.manual_seed(0)
    bare = program()
    autograd_guard.install(policy or {})
    try:
        assert_attached("grad_health", "torch.optim.optimizer")
        with capture_events() as events:
            torch.manual_seed(0)
            guarded = program()
        if canary:
            assert_guard_on()
    finally:
        autograd_guard.uninstall()
    return bare, guarded, events


def assert_guard_on() -> None:
    """A NaN step is seen (and, in fix, skipped): the guard is on in this process."""
    w = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([w], lr=0.1)
    torch.sqrt((w * 0).pow(2).sum()).backward()
    strict = contextlib.suppress(autograd_guard.GuardError)
    with capture_events() as events, strict:
        optimizer.step()
    assert [e["action"] for e in events][:1] == ["nonfinite_gradient"], events


def outcome(params: Any, *optimizers: Any, **extra: Any) -> Outcome:
    """Copies of the weights, each optimizer's state and whatever else the program kept."""
    return {
        "weights": [p.detach().clone() for p in params],
        "state": [_copy(o.state_dict()) for o in optimizers],
        **{k: _copy(v) for k, v in extra.items()},
    }


def assert_same(left: Any, right: Any, path: str = "") -> None:
    """Equal bit for bit (NaN equal to NaN), at every depth."""
    if isinstance(left, torch.Tensor):
        assert isinstance(right, torch.Tensor), path
        torch.testing.assert_close(left, right, rtol=0, atol=0, equal_nan=True, msg=path)
    elif isinstance(left, dict):
        assert isinstance(right, dict) and left.keys() == right.keys(), path
        for key in left:
            assert_same(left[key], right[key], f"{path}.{key}")
    elif isinstance(left, (list, tuple)):
        assert isinstance(right, (list, tuple)) and len(left) == len(right), path
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            assert_same(a, b, f"{path}[{index}]")
    elif isinstance(left, float) and math.isnan(left):
        assert isinstance(right, float) and math.isnan(right), path
    else:
        assert left == right, f"{path}: {left!r} != {right!r}"


def hook_log(optimizer: Any, log: list[Any]) -> None:
    """User step hooks that log the gradient norms they see (as a user's logging does)."""

    def norms(tag: str) -> Callable[..., None]:
        def hook(opt: Any, args: Any, kwargs: Any) -> None:
            params = [p for group in opt.param_groups for p in group["params"]]
            log.append((tag, [p.grad.norm().item() for p in params if p.grad is not None]))

        return hook

    optimizer.register_step_pre_hook(norms("pre"))
    optimizer.register_step_post_hook(norms("post"))


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_copy(v) for v in value]
    return value
