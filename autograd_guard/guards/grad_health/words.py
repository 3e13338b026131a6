"""What grad_health says: where a step was called from, and what became of it, in words
that are true of the weights at the moment they are logged."""

from __future__ import annotations

import sys
import weakref

from autograd_guard._common.callsite import find_callsite
from autograd_guard.guards.grad_health.gate import RUN, SKIP
from autograd_guard.guards.grad_health.step import MULTI_EVALUATION

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType
    from typing import Any

    from autograd_guard.guards.grad_health.closure import Evaluation

# Trainer frameworks and optimizer wrappers whose lines are never the user's call site
FRAMEWORKS = (
    "torch",
    "accelerate",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "transformers",
    "deepspeed",
    "ignite",
    "pytorch_optimizer",
    "timm",
    "fairscale",
)

AS_BEFORE = "weights, optimizer state and param_groups as before it"
ON_DEVICE = {
    "fix": "the fused optimizer skipped this step on the device (weights and optimizer "
    "state as before it)",
    "observe": "the step ran with them (observe; fix would skip it)",
    "strict": "the step ran with them (found on the device after it)",
}


def step_outcome(
    mode: str, kind: str, gated: bool, evaluation: Evaluation | None, evaluations: int
) -> tuple[str, object]:
    """What becomes of a step with non-finite gradients in observe or fix, and the
    verdict that makes it so."""
    at = f" at evaluation {evaluations} of its closure" if evaluation is not None else ""
    if mode != "fix":
        return f"the step ran with them{at} (observe; fix would skip it)", RUN
    if not gated:
        return (
            f"the step ran with them: {kind}.step is not torch's hooked step function, so "
            "the guard cannot skip it (strict stops it)",
            RUN,
        )
    if evaluation is None:
        return f"this {kind} step was skipped: its body did not run ({AS_BEFORE})", SKIP
    evaluation.stopped = True
    if evaluation.snapshot is not None:
        return f"this {kind} step was skipped: stopped{at} and undone ({AS_BEFORE})", SKIP
    if not evaluation.moved():
        return (
            f"this {kind} step was skipped: stopped{at}, before it changed anything ({AS_BEFORE})",
            SKIP,
        )
    MULTI_EVALUATION.add(evaluation.kind)  # its later steps are snapshotted
    return (
        f"this {kind} step was stopped{at}, after it had already changed the weights: they "
        f"keep that change (later {kind} steps are snapshotted and undone whole)",
        SKIP,
    )


def stop_outcome(kind: str, evaluation: Evaluation | None, evaluations: int, group: bool) -> str:
    """strict: what is true of the weights once the step is stopped."""
    everywhere = " on every rank of its group" if group else ""
    if evaluation is None:
        return f"in this {kind} step: the step was stopped{everywhere} before the weights changed"
    evaluation.stopped = True
    at = f"at evaluation {evaluations} of this {kind} step's closure"
    if evaluation.snapshot is not None:
        return f"{at}: the step was stopped{everywhere} and undone ({AS_BEFORE})"
    if not evaluation.moved():
        return f"{at}: the step was stopped{everywhere} before the weights changed"
    return f"{at}: the step was stopped{everywhere}, after it had already changed the weights"


class StepSites:
    """The user's ``optimizer.step()`` line: the caller of the outermost step in progress
    (not a closure's or an inner optimizer's line), outside torch, this package and
    trainer frameworks; optimizers stepped from one line (a framework's loop) are told
    apart."""

    def __init__(self, step_codes: Callable[[], tuple[Any, ...]]) -> None:
        self._by_line: dict[str, list[Any]] = {}  # line -> weak refs of its optimizers
        self._step_codes = step_codes

    def site(self, optimizer: Any) -> str:
        codes = self._step_codes()
        frame: FrameType | None = sys._getframe(1)
        outermost = None
        while frame is not None:
            if frame.f_code in codes:
                outermost = frame
            frame = frame.f_back
        start = outermost.f_back if outermost is not None else None
        line = find_callsite(*FRAMEWORKS, "autograd_guard", start=start)
        if optimizer is None:
            return line
        refs = self._by_line.setdefault(line, [])
        for index, ref in enumerate(refs):
            if ref() is optimizer:
                return _numbered(line, optimizer, index)
        try:
            ref = weakref.ref(optimizer)
        except TypeError:
            return line
        for index, old in enumerate(refs):
            if old() is None:  # a collected optimizer's place is taken
                refs[index] = ref
                return _numbered(line, optimizer, index)
        refs.append(ref)
        return _numbered(line, optimizer, len(refs) - 1)


def _numbered(line: str, optimizer: Any, index: int) -> str:
    return line if index == 0 else f"{line} ({type(optimizer).__name__} #{index + 1})"
