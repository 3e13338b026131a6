"""The common step in one frame: one process, a plain optimizer whose every parameter has
had its first gradient, no closure, no GradScaler, gradients whose flag is read at once
(not CUDA's, which the full check may lend to a fused optimizer). ``StepFlow._check``
decides such a step the same way (the same ``FiniteCheck.all_finite``), through a dozen
helpers; in a short step (a small model on the CPU) their calls cost more than the
check's kernel, so the healthy case takes this path, and everything else (a first step,
a lost-gradient window, ranks that decide together, a localiser armed, a flag lent to a
fused optimizer, a non-finite gradient) the full one.

A mixin of ``StepFlow``.
"""

from __future__ import annotations

import sys

from autograd_guard.guards.grad_health import zero
from autograd_guard.guards.grad_health.gate import RUN
from autograd_guard.guards.grad_health.step import params_of
from autograd_guard.guards.grad_health.zero_params import in_window

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from autograd_guard.guards.grad_health.check import FiniteCheck, Probe, Slot
    from autograd_guard.guards.grad_health.closure import Evaluation
    from autograd_guard.guards.grad_health.record import Record, Records


class QuickFlow:
    """``_quick``: the verdict on a common step, or None (nothing done: the full check
    decides); ``_verdict``: the end both paths share."""

    config: dict[str, Any]
    _records: Records
    _finite: FiniteCheck
    _probe: Any
    _nonfinite: Callable[..., object]
    _zero_probe: Callable[..., Probe | None]
    _zero_counted: Callable[..., None]
    _zero_window: Callable[..., None]

    def _quick(
        self, optimizer: Any, record: Record, args: tuple[Any, ...], kwargs: Any, gated: bool
    ) -> object | None:
        if (
            kwargs
            or len(args) > 1  # a closure, or GradScaler's keyword
            or record.site is None  # the first step
            or record.waiting
            or record.watch is not None  # the lost-gradient window
            or record.sharing is not None  # ranks that decide together
            or self._probe is not None  # the localiser is armed
            or getattr(optimizer, "found_inf", None) is not None  # a flag lent, or GradScaler's
            or not self.config["nonfinite"]
        ):
            return None
        params = params_of(optimizer)
        if record.shared_known != len(params) or (
            len(params) != record.known and self.config["lost_steps"]
        ):
            return None  # parameters added since: the full check registers them
        grads = [g for p in params if (g := p.grad) is not None]  # one read of each
        if not grads or type(grads[0]) is not sys.modules["torch"].Tensor:
            return None
        slot = self._finite.slot(grads[0].device)
        if slot.deferred:  # the flag may stay on the device (CUDA): the full check lends it
            return None
        # as _step_starts and _check do, in their order
        record.step += 1
        self._records.steps += 1
        record.evaluations = 0
        record.empty = 0
        flag = self._zero_probe(record, grads)
        return self._verdict(optimizer, record, params, grads, slot, flag, gated, None)

    def _verdict(
        self,
        optimizer: Any,
        record: Record,
        consumed: list[Any],
        grads: list[Any],
        slot: Slot | None,
        flag: Probe | None,
        gated: bool,
        evaluation: Evaluation | None,
    ) -> object:
        """The verdict on the gradients the step consumes (``grads``, read once): RUN with
        the zero streak counted, or what ``_nonfinite`` says. Both paths end here."""
        if self._finite.all_finite(grads, slot, flag):
            record.in_a_row = 0
            if flag is not None:
                self._zero_counted(optimizer, record, zero.all_zero(record, grads, flag))
            if record.zero_params is not None and in_window(record, self.config["zero_steps"]):
                self._zero_window(optimizer, record, consumed)
            return RUN
        bad = [p for p in consumed if p.grad is not None]
        return self._nonfinite(optimizer, record, bad, gated=gated, evaluation=evaluation)
