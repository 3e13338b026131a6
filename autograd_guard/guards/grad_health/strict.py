"""grad_health's strict stop that names the op: strict is the mode of CI, where the op that
made a non-finite gradient is the most useful fact, and raising at the first non-finite step
left it unknown.

So at the first such step strict skips the step, as fix does (its body never runs: the
weights, the optimizer's state and ``param_groups`` as before it), and records the next
backward pass with the localiser (the cost of ``torch.autograd.detect_anomaly()`` for that
one pass); the next optimizer step raises ``GuardError`` before it runs, naming the op and
its forward line (or why it was not found: a one-off value), with the weights still
unchanged. The stop belongs to the optimizer whose step was skipped: another optimizer's
step (a GAN's other half, a rank's local optimizer beside a shared one) runs as it would,
so no rank stops in a place its own code does not expect. A run that ends before that
optimizer steps again ends with exit status 3, said at exit.
Where a step cannot be skipped (a closure's evaluation, an optimizer class with no gate,
ranks that decide together, a flag left on the device) or ``localize_steps = 0``, strict
raises at the first non-finite step, as before.

A mixin of ``GradHealth``.
"""

from __future__ import annotations

from autograd_guard.guards.grad_health.probe import BackwardProbe

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from collections.abc import Callable
    from typing import Any, NoReturn

    from autograd_guard.guards.grad_health.compile import EagerHooks
    from autograd_guard.guards.grad_health.record import Record

STEPS = 16  # the recording's bound in optimizer steps (of any optimizer) with no backward pass

STOPPED = (
    "this {kind} step was skipped (weights, optimizer state and param_groups as before it), "
    "the next backward pass recorded, and the run stopped at this optimizer's next step, "
    "before the weights changed"
)


class StrictStop:
    """``_defer_stop`` at a non-finite step; ``_stop_pending`` at the next one."""

    config: dict[str, Any]
    _hooks: EagerHooks
    _probe: BackwardProbe | None
    _probe_site: str | None
    _probes_left: int
    _probe_lock: threading.Lock
    _pending_stop: tuple[Record, BackwardProbe, str, str, str, Any] | None
    emit: Callable[..., bool]
    refuse: Callable[..., NoReturn]
    _probe_finished: Callable[..., None]
    _nonfinite_remedy: Callable[[], str]

    def _defer_stop(
        self, optimizer: Any, record: Record, stop: tuple[str, str, Any], when: tuple[Any, ...]
    ) -> bool:
        """strict: skip this step and record the next pass; False where the step is to be
        stopped at once (see the module's docstring). ``stop``: what, where, the names;
        ``when``: whether the step is gated, its closure's evaluation, its sharing."""
        gated, evaluation, sharing = when
        if (
            not gated
            or evaluation is not None
            or sharing is not None
            or record.sharing is not None
            or not self.config["localize_steps"]
            or getattr(self, "_pending_stop", None) is not None
        ):
            return False
        what, site, names = stop
        with self._probe_lock:
            if self._probe is not None or self._probes_left <= 0:
                return False
            self._probes_left -= 1
            # one pass; the steps of other optimizers before it do not end it
            probe = BackwardProbe(1, STEPS, self._hooks.eager)
            probe.arm()
            self._probe, self._probe_site = probe, site
        kind = type(optimizer).__name__
        self._pending_stop = (record, probe, kind, what, site, names)
        self.emit(
            f"{what}: this {kind} step was skipped (weights, optimizer state and param_groups "
            "as before it); strict records the next backward pass to name the op, and this "
            "optimizer's next step raises",
            action="nonfinite_gradient",
            callsite=site,
            level="error",
            parameters=names,
            remedy=self._nonfinite_remedy(),
        )
        return True

    def _stop_pending(self, record: Record | None = None, at_exit: bool = False) -> None:
        """The deferring optimizer's next step (``record``) or the exit: the op the
        recorded pass named, and the stop (raised; at exit, logged with exit status 3)."""
        pending = getattr(self, "_pending_stop", None)
        if pending is None or (not at_exit and pending[0] is not record):
            return
        self._pending_stop = None
        _, probe, kind, what, site, names = pending
        from autograd_guard.guards.grad_health import findings

        remedy = self._nonfinite_remedy()
        recording = self._probe is probe  # else finished at another optimizer's step, and said
        if recording:
            probe.disarm()
            self._probe_finished(probe, at_exit=at_exit)  # nonfinite_origin: the op, or why not
        if probe.origin is not None:
            op, line = probe.origin
            what += f", made by {op} (the backward of line {findings._short(line, site)})"
            remedy = findings.MAKE_SAFE
        event = f"{what}: {STOPPED.format(kind=kind)}"
        fields = {"action": "nonfinite_gradient", "callsite": site, "parameters": names}
        if not at_exit:
            self.refuse(event, remedy=remedy, **fields)
        event = event.replace(
            ", the next backward pass recorded, and the run stopped at this optimizer's next "
            "step, before the weights changed",
            "; the run ended before another step (exit status 3)",
        )
        self.emit(event, level="error", remedy=remedy, always=True, **fields)  # not the skip's
        findings._strict_finding()
