"""grad_health on a step with a closure (LBFGS, SAM, Lightning's automatic optimisation):
the gradients exist only once the closure has run inside the step body.

The closure is wrapped: after each evaluation the gradients are checked, and a non-finite
evaluation stops the body there (a private ``BaseException``, which no optimizer's
``except Exception`` catches). Whether the weights had moved is read from the
parameters' version counters, never assumed. Steps that may move them before an
evaluation (LBFGS; any optimizer outside ``torch.optim``, such as SAM's first step) are
snapshotted, so a stopped step is undone whole; a third-party optimizer's step is also
checked before its body, on the gradients it was handed (SAM's first step uses them).
"""

from __future__ import annotations

from autograd_guard.errors import GuardError
from autograd_guard.guards.grad_health.gate import RUN, SKIP
from autograd_guard.guards.grad_health.step import (
    MULTI_EVALUATION,
    Snapshot,
    evaluates_first,
    params_of,
    with_closure,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from autograd_guard.guards.grad_health.record import Record
    from autograd_guard.guards.grad_health.voice import Voice


class StepStopped(BaseException):
    """Raised out of a closure evaluation to stop the step body (fix)."""

    def __init__(self, loss: Any, evaluation: Evaluation) -> None:
        super().__init__()
        self.loss, self.evaluation = loss, evaluation


class Evaluation:
    """One closure step in progress: its snapshot and the parameters' versions."""

    __slots__ = ("kind", "params", "snapshot", "stopped", "versions")

    def __init__(self, kind: type, params: list[Any], snapshot: Snapshot | None) -> None:
        self.kind = kind
        self.params = params
        self.snapshot = snapshot
        self.versions = [p._version for p in params]
        self.stopped = False  # the guard stopped the body (fix or strict)

    def moved(self) -> bool:
        """The weights changed since the step began (read before any restore)."""
        return any(p._version != v for p, v in zip(self.params, self.versions, strict=True))

    def undo(self) -> None:
        """After the body stopped: back to the snapshot, if there is one."""
        if self.stopped and self.snapshot is not None:
            self.snapshot.restore()


class Closures:
    """Steps with a closure, handed by the step flow with the three things it needs from
    it: ``check`` (the verdict on the gradients now), ``leave`` (the step is over) and
    ``active`` (the guard is still on)."""

    def __init__(
        self,
        voice: Voice,
        check: Callable[..., object],
        leave: Callable[[Record], None],
        active: Callable[[], bool],
    ) -> None:
        self._voice, self._check, self._leave, self._active = voice, check, leave, active

    def step(self, body: Callable[..., Any], args: Any, kwargs: Any, record: Record) -> Any:
        optimizer = args[0]
        try:
            closure, position = record.closure or (None, -1)
            record.closure = None
            evaluation, verdict = self._closure_starts(optimizer, record, kwargs)
        except GuardError:
            self._leave(record)
            raise
        except Exception as exc:  # fail open: the step runs as it would unguarded
            self._voice.fail("step check", exc)
            evaluation, verdict = None, RUN
        try:
            if verdict == SKIP:
                return None
            if evaluation is not None:
                checked = self._checked_closure(optimizer, record, closure, evaluation)
                args, kwargs = with_closure(args, kwargs, checked, position)
            try:
                result = body(*args, **kwargs)
            except StepStopped as stopped:
                stopped.evaluation.undo()
                return stopped.loss
            except GuardError:
                if evaluation is not None:
                    evaluation.undo()  # strict stopped it: back to before the step
                raise
            if evaluation is not None and evaluation.stopped:
                self._swallowed(optimizer, evaluation)  # the body caught the guard's stop
            return result
        finally:
            self._leave(record)
            record.stale = _grad_versions(optimizer)

    def _swallowed(self, optimizer: Any, evaluation: Evaluation) -> None:
        """The step body caught the guard's stop and went on: it is undone again from the
        snapshot; strict raises once more, outside the body."""
        evaluation.undo()
        if self._voice.mode == "strict":
            raise GuardError(
                f"autograd-guard [grad_health]: the {type(optimizer).__name__} step caught "
                "the guard's error for its non-finite gradients and went on"
                + ("; it was undone" if evaluation.snapshot is not None else "")
            )

    def _closure_starts(
        self, optimizer: Any, record: Record, kwargs: Any
    ) -> tuple[Evaluation | None, object]:
        """The step's evaluation record (None: nothing to check) and the verdict on the
        gradients handed to a third-party optimizer."""
        if not self._voice.config["nonfinite"]:
            return None, RUN
        first = evaluates_first(optimizer)
        handed = _grad_versions(optimizer)
        if not first and handed and handed != record.stale:
            verdict = self._check(optimizer, record, kwargs)  # SAM's first step uses them
            if verdict == SKIP:
                return None, SKIP
        snapshot = None if first or self._voice.mode == "observe" else Snapshot(optimizer)
        return Evaluation(type(optimizer), params_of(optimizer), snapshot), RUN

    def _checked_closure(
        self, optimizer: Any, record: Record, closure: Any, evaluation: Evaluation
    ) -> Callable[[], Any]:
        def closure_then_check() -> Any:
            loss = closure()
            record.evaluations += 1
            if self._active():
                self._evaluated(optimizer, record, evaluation, loss)
            return loss

        return closure_then_check

    def _evaluated(self, optimizer: Any, record: Record, evaluation: Evaluation, loss: Any) -> None:
        """The closure ran inside ``step()``: its gradients exist only now."""
        try:
            if record.evaluations > 1:
                MULTI_EVALUATION.add(type(optimizer))
            record.no_loss = loss is None  # Lightning's way to skip a step: no gradients
            verdict = self._check(optimizer, record, {}, evaluation=evaluation)
        except GuardError:
            raise
        except Exception as exc:
            self._voice.fail("step check", exc)
            return
        if verdict == SKIP:
            raise StepStopped(loss, evaluation)


def _grad_versions(optimizer: Any) -> list[tuple[int, int]]:
    """Which gradients the parameters hold, and their versions: the gradients a closure
    step left behind are told from new ones (a backward before the next step)."""
    return [(id(grad), grad._version) for p in params_of(optimizer) if (grad := p.grad) is not None]
