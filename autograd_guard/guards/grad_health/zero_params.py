"""grad_health's zero-gradient parameter: one parameter's gradient exactly zero at every
one of an optimizer's first ``zero_steps`` steps, while others' are not.

Symptom: one parameter never moves while the rest of the model trains, and nothing says
why: its gradient is present, finite and 0.0, so neither the lost-gradient check (a
gradient that is missing) nor the zero-gradient streak (which needs *every* gradient to be
zero) has anything to say. Seen with a Warp ``@wp.func`` with a runtime loop whose adjoint
is stale: the Warp-side parameter's gradient was exactly 0 at every step while the torch
head beside it trained; also a layer whose ReLUs are all dead, a branch multiplied by a
mask of zeros. A bias that a normalisation layer cancels gets tiny gradients that are not
0.0: not this finding; nor a zero-initialised gate (ReZero, LoRA's B) whose branch gets a
gradient from the second step on.
Remedy: said once per optimizer (a warning in every mode: the steps are not touched), with
the parameters' names.

Cost: only in an optimizer's first ``zero_steps`` steps, on the steps whose gradients are
finite: one ``_foreach_norm`` (the largest magnitude: tiny values never underflow) of
its gradients per device, kept on the device; after the last of them, one read of them all
(a sync). After that window, one integer comparison per step.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from autograd_guard.guards.grad_health.record import Record


def in_window(record: Record, steps: int) -> bool:
    return bool(steps) and record.step <= steps and record.evaluations <= 1


def keep(record: Record, params: list[Any]) -> None:
    """This step's gradients' largest magnitudes, on their devices (no sync)."""
    torch = sys.modules["torch"]
    pairs = [(p, g) for p in params if (g := p.grad) is not None]
    if any(type(g) is not torch.Tensor or g.is_sparse or g.is_meta for _, g in pairs):
        record.zero_params = None  # values it cannot read: the window is given up
        return
    kept = record.zero_params
    if kept is None:
        return
    by_device: dict[Any, list[tuple[Any, Any]]] = {}
    for param, grad in pairs:
        if grad.numel():
            by_device.setdefault(grad.device, []).append((param, grad))
    for group in by_device.values():
        largest = torch._foreach_norm([g for _, g in group], float("inf"))
        kept.append(([p for p, _ in group], torch.stack(largest)))


def zero_throughout(record: Record, steps: int) -> list[Any]:
    """At the window's last step: the parameters that had a gradient at every step of it,
    each exactly zero, where some other parameter's was not (one read of every kept
    value); [] otherwise. The kept values are dropped."""
    kept, record.zero_params = record.zero_params, None
    if not kept:
        return []
    seen: dict[int, list[Any]] = {}  # id -> [parameter, steps with a gradient, any non-zero]
    for params, largest in kept:
        for param, value in zip(params, largest.tolist(), strict=True):
            entry = seen.setdefault(id(param), [param, 0, False])
            entry[1] += 1
            entry[2] = entry[2] or value != 0
    if not any(nonzero for _, _, nonzero in seen.values()):
        return []  # every gradient zero: the zero-gradient streak's to say
    return [param for param, count, nonzero in seen.values() if count >= steps and not nonzero]


def event(kind: str, names: list[str], steps: int) -> str:
    which = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    return (
        f"the gradient of {which} was exactly zero at every one of this {kind}'s first "
        f"{steps} steps while other parameters' were not: "
        f"{'it does' if len(names) == 1 else 'they do'} not train"
    )


REMEDY = (
    "check what reaches the parameter: an op whose gradient is zero (a stale or wrong "
    "adjoint in a custom kernel, such as a Warp @wp.func with a runtime loop; round, a hard "
    "threshold), a mask or weight of zeros in front of it, a layer whose ReLUs are all dead "
    "(zero_steps = 0 turns this off)"
)
