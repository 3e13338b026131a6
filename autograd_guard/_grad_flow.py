"""The step logic of grad_health's hooks: where the check runs (before the step, or after
each evaluation of its closure), what a skipped step looks like to the optimizer and to
the user, and how torch 2.1's hook-less steps and lent device flags fit in.

A mixin of ``GradHealth``: the guard holds the state and reports; this is the flow.
"""

from __future__ import annotations

import sys

from autograd_guard._grad_check import PendingFlag
from autograd_guard._grad_step import (
    MULTI_EVALUATION,
    SkipWindow,
    Snapshot,
    closure_of,
    evaluates_repeatedly,
    params_of,
    with_closure,
)
from autograd_guard.errors import GuardError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from autograd_guard._environment import Mode
    from autograd_guard._grad_check import FiniteCheck, Slot
    from autograd_guard._grad_compile import EagerHooks
    from autograd_guard._grad_probe import BackwardProbe
    from autograd_guard._grad_record import Record, Records


NO_CLOSURE = (None, -1)


class StepFlow:
    """What runs at each optimizer step (``GradHealth`` provides the state and reports)."""

    active: bool
    mode: Mode
    config: dict[str, Any]
    _records: Records
    _finite: FiniteCheck
    _hooks: EagerHooks
    _probe: BackwardProbe | None
    fail: Callable[[str, BaseException], None]
    _nonfinite: Callable[..., None]
    _report_lost: Callable[[list[Any]], None]
    _probe_finished: Callable[[BackwardProbe], None]
    _refuse: Callable[..., Any]

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        if not self.active:
            return None
        try:
            return self._step_starts(optimizer, self._records.get(optimizer), args, kwargs)
        except GuardError:
            raise  # strict: the step must not run
        except Exception as exc:  # fail open: the optimizer steps as it would unguarded
            self.fail("step check", exc)
            return None

    def _step_starts(self, optimizer: Any, record: Record, args: Any, kwargs: Any) -> Any:
        if record.window is not None or record.flag is not None:
            self._step_over(optimizer, record)  # the last step raised before its post-hooks
        record.step += 1
        record.evaluations = 0
        # optimizer.step() with no argument, the common case, has no closure
        closure, position = (
            closure_of(optimizer, args, kwargs) if kwargs or len(args) > 1 else NO_CLOSURE
        )
        if closure is not None:
            if (
                self.mode != "observe"
                and self.config["nonfinite"]
                and evaluates_repeatedly(optimizer)
            ):
                record.snapshot = Snapshot(optimizer)
            checked = self._closure_then_check(optimizer, record, closure)
            return with_closure(args, kwargs, checked, position)
        params = params_of(optimizer)
        self._check(optimizer, record, params, kwargs)
        return None

    def _closure_then_check(self, optimizer: Any, record: Record, closure: Any) -> Any:
        evaluated = self._hooks.eager_method(self._evaluated)

        def closure_then_check() -> Any:
            loss = closure()
            record.evaluations += 1
            if self.active:
                evaluated(optimizer, record)
            return loss

        return closure_then_check

    def _evaluated(self, optimizer: Any, record: Record) -> None:
        """The closure ran inside ``step()``: its gradients exist only now."""
        try:
            if record.evaluations > 1:
                MULTI_EVALUATION.add(type(optimizer))
            params = params_of(optimizer)
            if record.window is not None:
                record.window.hide()  # a skipped step: later gradients are kept out too
            else:
                self._check(optimizer, record, params, {})
        except GuardError:
            raise
        except Exception as exc:
            self.fail("step check", exc)

    def _check(self, optimizer: Any, record: Record, params: list[Any], kwargs: Any) -> None:
        lost_steps = self.config["lost_steps"]
        if (
            lost_steps
            and record.evaluations <= 1
            and (record.waiting or len(params) != record.known)
        ):
            lost = record.lost(params, lost_steps)
            if lost:
                self._report_lost(lost)
        if not self.config["nonfinite"] or _scaler_decides(optimizer, kwargs, record):
            return
        grads = [g for g in [p.grad for p in params] if g is not None]  # one read of each
        if not grads:
            return
        first = grads[0]
        plain = type(first) is sys.modules["torch"].Tensor  # not fake tensors and the like
        slot = self._finite.slot(first.device) if plain else None
        if slot is not None and slot.deferred and self._lend_flag(optimizer, record, grads, slot):
            return
        if self._finite.all_finite(grads, slot):
            record.in_a_row = 0
            return
        self._nonfinite(optimizer, record, [p for p in params if p.grad is not None])

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        record = self._records.find(optimizer)
        try:
            if record is not None and (
                record.window or record.snapshot or record.flag is not None or record.pending
            ):
                self._step_over(optimizer, record)
            probe = self._probe
            if probe is not None and probe.step_done():
                self._probe_finished(probe)
        except Exception as exc:  # fail open
            self.fail("after step", exc)

    def _step_over(self, optimizer: Any, record: Record) -> None:
        window, record.window, record.snapshot = record.window, None, None
        if window is not None:
            window.restore()  # done already by its own post-hook, unless the step raised
            window.detach()
        if record.flag is not None:
            if optimizer.__dict__.get("found_inf") is record.flag:
                del optimizer.__dict__["found_inf"]
            record.flag = None
        while record.pending and record.pending[0][1].ready():
            step, pending = record.pending.popleft()
            if not pending.nonfinite():
                record.in_a_row = 0
            elif step == record.step:  # read in its own step: its gradients are current
                self._nonfinite(
                    optimizer,
                    record,
                    [p for p in params_of(optimizer) if p.grad is not None],
                    on_device=True,
                )
            else:
                self._nonfinite(optimizer, record, [], on_device=True)

    def _run_unhooked_step(
        self, step: Callable[..., Any], optimizer: Any, args: Any, kwargs: Any
    ) -> Any:
        """torch 2.1 after a compile: ``step`` calls no hooks; the guard runs around it."""
        record = self._records.get(optimizer)
        record.unhooked = True
        try:
            changed = self._before_step(optimizer, (optimizer, *args), kwargs)
            if changed is not None:
                args, kwargs = changed[0][1:], changed[1]
            return step(optimizer, *args, **kwargs)
        finally:
            record.unhooked = False
            self._after_step(optimizer, args, kwargs)

    # -- non-finite gradients ----------------------------------------------------------

    def _lend_flag(self, optimizer: Any, record: Record, grads: list[Any], slot: Slot) -> bool:
        """On a device where reading the flag means a host sync (CUDA): a fused optimizer
        takes it (fix) and skips the step itself; ``observe`` reads it steps later. Not on
        a parameter's first step: fused SGD's kernel, skipping, leaves the momentum buffer
        it just made uninitialised."""
        lend = (
            self.mode == "fix"
            and getattr(optimizer, "_step_supports_amp_scaling", False)
            and len(optimizer.state) >= len(grads)
        )
        if not (lend or self.mode == "observe"):
            return False
        flag = self._finite.device_flag(grads, slot)
        if flag is None:
            return False
        if lend:
            optimizer.found_inf = record.flag = flag
        record.pending.append((record.step, PendingFlag(flag)))
        return True

    def _skip(
        self,
        optimizer: Any,
        record: Record,
        with_grad: list[Any],
        on_device: bool,
        what: str,
        site: str,
        names: Any,
    ) -> str:
        """Skip the step (fix) or raise (strict); what happened, in words."""
        evaluation, snapshot = record.evaluations, record.snapshot
        kind = type(optimizer).__name__
        moved = evaluation > 1 and snapshot is None  # weights changed at earlier evaluations
        at = f" at evaluation {evaluation} of the closure" if evaluation > 1 else ""
        if on_device:
            if self.mode == "fix":
                return (
                    "the fused optimizer skipped this step on the device (weights and "
                    "optimizer state as before it)"
                )
            return "the step ran with them (observe; fix would skip it)"
        if self.mode == "strict":
            if snapshot is not None:
                snapshot.restore()
            self._refuse(f"{what}{at} of this {kind} step", site, names, moved)
        if self.mode == "observe":
            return f"the step ran with them{at} (observe; fix would skip it)"
        window = SkipWindow(params_of(optimizer), snapshot)
        if evaluation or record.unhooked:
            window.hide()  # inside step() already: from now on
        if not record.unhooked:
            window.attach(optimizer, self._hooks.eager_method, hide=not evaluation)
        record.window = window
        if not moved:
            return f"this {kind} step was skipped{at} (weights and optimizer state as before it)"
        MULTI_EVALUATION.add(type(optimizer))
        return (
            f"found{at}, after this {kind} step had already updated the weights; the rest "
            "of the step got no gradients, so the weights keep that update (later "
            f"{kind} steps are snapshotted and undone whole)"
        )


def _scaler_decides(optimizer: Any, kwargs: Any, record: Record) -> bool:
    """GradScaler handed this step to an optimizer that unscales and skips inf steps itself
    (fused Adam/AdamW/SGD): the gradients are still scaled, and an inf is expected."""
    if "grad_scaler" in kwargs:
        return True
    found = getattr(optimizer, "found_inf", None)
    return found is not None and found is not record.flag
