"""The step logic of grad_health: the check runs in the gate between the step hooks and the
step body (``gate``), after every pre-hook; a skipped step is a body that never ran.
A step with a closure is checked after each evaluation and, when one is not finite,
stopped there and undone whole from a snapshot (``closure``). A mixin of ``GradHealth``:
the guard holds the state and reports; this is the flow.
"""

from __future__ import annotations

import sys
import threading

from autograd_guard.errors import GuardError, Refused
from autograd_guard.guards.grad_health import usage
from autograd_guard.guards.grad_health.check import PendingFlag
from autograd_guard.guards.grad_health.closure import ClosureFlow
from autograd_guard.guards.grad_health.dist import local_gradient
from autograd_guard.guards.grad_health.gate import CLOSURE, RUN, SKIP
from autograd_guard.guards.grad_health.quick import QuickFlow
from autograd_guard.guards.grad_health.step import closure_of, params_of
from autograd_guard.guards.grad_health.together import SharedFlow
from autograd_guard.guards.grad_health.usage import UsageFlow
from autograd_guard.guards.grad_health.zero import ZeroFlow, held

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from autograd_guard._common.environment import Mode
    from autograd_guard.guards.grad_health.check import FiniteCheck, Slot
    from autograd_guard.guards.grad_health.closure import Evaluation
    from autograd_guard.guards.grad_health.compile import EagerHooks
    from autograd_guard.guards.grad_health.gate import Gates
    from autograd_guard.guards.grad_health.probe import BackwardProbe
    from autograd_guard.guards.grad_health.record import Record, Records
    from autograd_guard.guards.grad_health.words import StepSites


class StepFlow(QuickFlow, SharedFlow, ZeroFlow, UsageFlow, ClosureFlow):
    """What runs at each optimizer step (``GradHealth`` provides the state and reports)."""

    active: bool
    mode: Mode
    config: dict[str, Any]
    _records: Records
    _finite: FiniteCheck
    _hooks: EagerHooks
    _gates: Gates
    _sites: StepSites
    _stepping: threading.local  # steps in progress on this thread
    _probe: BackwardProbe | None
    fail: Callable[[str, BaseException], None]
    _nonfinite: Callable[..., object]
    _report_lost: Callable[..., None]
    _probe_finished: Callable[..., None]
    _mended_verdict: Callable[..., object | None]
    _repair_over: Callable[[Any], None]
    _repairer: Any
    _stop_pending: Callable[..., None]

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The first global pre-hook: gate the optimizer's class (once per class); a class
        with no gate is checked here, where its step can be stopped but not skipped."""
        if not self.active:
            return
        try:
            if self._gates.ensure(type(optimizer)):
                return
            verdict = self._decide(args, kwargs, gated=False)
        except GuardError:
            raise
        except Exception as exc:  # fail open: the optimizer steps as it would unguarded
            self.fail("step check", exc)
            return
        if isinstance(verdict, Refused):  # strict: the step does not run
            raise verdict.error  # autograd-guard strict: the message says why
        self._finish(optimizer, True, False)
        if verdict == CLOSURE:
            self._records.get(optimizer).closure = None  # checked only before the step

    def _decide(self, args: Any, kwargs: Any, gated: bool = True) -> object:
        """RUN, SKIP or CLOSURE for the step about to run; in strict, a ``Refused`` that
        its caller raises (from one frame of the guard's)."""
        optimizer = args[0]
        if not self.active:
            return RUN
        record = self._records.get(optimizer)
        if record.depth or self._stepping.__dict__.get("depth", 0):
            if not gated or self._gates.nested():
                self._enter(record)
                return RUN  # super().step(), or an inner optimizer of a step being checked
            record.depth = self._stepping.__dict__["depth"] = 0  # left by an interrupted step
        self._enter(record)
        try:
            self._stop_pending(record)  # strict: the op the pass after its skipped step named
            if record.flag is not None:
                self._step_over(optimizer, record)  # the last step raised before its post-hooks
            verdict = self._quick(optimizer, record, args, kwargs, gated)
            if verdict is None:  # not the common step (see .quick)
                verdict = self._step_starts(optimizer, record, args, kwargs, gated)
        except GuardError as strict:
            self._leave(record)
            return Refused(strict)
        except Exception as exc:
            try:
                self.fail("step check", exc)  # fail open: the step runs
            except GuardError as strict:  # strict: the guard's own failure stops the step
                self._leave(record)
                return Refused(strict)
            return RUN
        except BaseException:  # Ctrl-C in the check: the step does not run
            self._leave(record)
            raise
        if verdict == SKIP:
            self._leave(record)
        return verdict

    def _finish(self, optimizer: Any, leave: bool, after: bool) -> object:
        """A gated step is over, before any post-hook: left (where its body ran, or
        raised), and what comes after a step done (where it did not raise)."""
        record = self._records.find(optimizer)
        if leave and record is not None:
            self._leave(record)
        if (
            after
            and self.active
            and (
                self._probe is not None
                or self._repairer is not None
                or (record is not None and (record.flag is not None or record.pending))
            )
        ):  # else nothing comes after it (a healthy step)
            try:
                self._step_done(optimizer, record)
            except GuardError as strict:  # strict: raised by the gate
                return Refused(strict)
        return None

    def _enter(self, record: Record) -> None:
        """A step of this optimizer is in progress on this thread (steps nest)."""
        record.depth += 1
        stepping = self._stepping.__dict__
        stepping["depth"] = stepping.get("depth", 0) + 1

    def _leave(self, record: Record) -> None:
        if record.depth:
            record.depth -= 1
            stepping = self._stepping.__dict__
            stepping["depth"] = max(stepping.get("depth", 1) - 1, 0)

    def _step_starts(
        self, optimizer: Any, record: Record, args: Any, kwargs: Any, gated: bool
    ) -> object:
        record.step += 1
        self._records.steps += 1
        record.evaluations = 0
        record.probed = None  # a step that raised left its gradients there
        if record.site is None:  # once per optimizer: for what is said of it at exit
            record.kind, record.site = type(optimizer).__name__, self._sites.site(optimizer)
        # optimizer.step() with no argument, the common case, has no closure
        closure = closure_of(optimizer, args, kwargs) if kwargs or len(args) > 1 else None
        if closure is not None and closure[0] is not None:
            record.closure = closure
            return CLOSURE
        return self._check(optimizer, record, kwargs, gated)

    def _check(
        self,
        optimizer: Any,
        record: Record,
        kwargs: Any,
        gated: bool = True,
        evaluation: Evaluation | None = None,
    ) -> object:
        """The verdict on the gradients the step is about to use (or its closure made)."""
        params = params_of(optimizer)
        if record.waiting or record.watch is not None or len(params) != record.known:
            self._lost_check(optimizer, record, params)  # else nothing to do (every step)
        if not self.config["nonfinite"] or _scaler_decides(optimizer, kwargs, record):
            self._no_gradient(optimizer, record, params)
            return RUN
        sharing = record.sharing  # found once per set of parameters
        if record.shared_known != len(params):
            sharing = self._sharing(optimizer, record, params)
        consumed = sharing.shard if sharing is not None else params
        grads = [g for p in consumed if (g := p.grad) is not None]  # one read of each
        if grads:
            record.empty = 0
        else:  # not a zero step: a streak of them ends ("none missing")
            record.zero_in_a_row = 0
            self._no_gradient(optimizer, record, params)
        if sharing is not None and self.mode != "observe" and sharing.channel.closed is None:
            return self._decide_together(
                optimizer, record, consumed, grads, sharing, gated, evaluation
            )
        if not grads:
            return RUN
        mended = self._mended_verdict(optimizer, record, gated) if self._probe is not None else None
        if mended is not None:
            return mended
        first = grads[0]
        plain = type(first) is sys.modules["torch"].Tensor  # not fake tensors and the like
        slot = self._finite.slot(first.device) if plain else None
        if slot is not None and slot.deferred:
            self._zero_suspected(optimizer, record, grads)
            if self._lend_flag(optimizer, record, grads, slot):
                return RUN
        local = grads if plain else [local_gradient(g) for g in grads]
        flag = self._zero_probe(record, local) if sharing is None else None
        return self._verdict(optimizer, record, consumed, local, slot, flag, gated, evaluation)

    def _lost_check(self, optimizer: Any, record: Record, params: list[Any]) -> None:
        lost_steps = self.config["lost_steps"]
        if (
            lost_steps
            and record.evaluations <= 1
            and (record.waiting or record.watch is not None or len(params) != record.known)
        ):  # on a healthy step, once every parameter has had a gradient: nothing to do
            new = len(params) != record.known
            usage.read(record, params, new)
            lost = record.lost(params, lost_steps) if record.waiting or new else []
            usage.begin(record, self._hooks.eager)
            if lost:
                self._report_lost(optimizer, record, lost)

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The post-hook, only where some class has no gate: the work after its step."""
        if self.active and not self._gates.ensure(type(optimizer)):
            self._step_done(optimizer, self._records.find(optimizer))

    def _step_done(self, optimizer: Any, record: Record | None) -> None:
        try:
            if record is not None and (record.flag is not None or record.pending):
                self._step_over(optimizer, record, ended=True)
            probe = self._probe
            if probe is not None and probe.step_done():
                self._probe_finished(probe)
            self._repair_over(optimizer)
        except Exception as exc:  # fail open
            self.fail("after step", exc)

    def _step_over(self, optimizer: Any, record: Record, ended: bool = False) -> None:
        """The flags left on the device, read once ready; ``ended``: at the end of a step
        (its post-hooks), where that step's gradients are still current."""
        if record.flag is not None:
            if optimizer.__dict__.get("found_inf") is record.flag:
                del optimizer.__dict__["found_inf"]
            record.flag = None
        probed, record.probed = record.probed, None  # held for this step's end only
        while record.pending and record.pending[0][1].ready():
            step, pending = record.pending.popleft()
            if not pending.nonfinite():
                record.in_a_row = 0
                if pending.probed_zero():  # read at its step's end, the step is counted
                    own = ended and step == record.step
                    self._zero_read(optimizer, record, probed if own else None)
            elif step == record.step:  # read in its own step: its gradients are current
                params = [p for p in params_of(optimizer) if p.grad is not None]
                self._nonfinite(optimizer, record, params, on_device=True)
            else:
                self._nonfinite(optimizer, record, [], on_device=True)

    def _run_unhooked_step(
        self, step: Callable[..., Any], optimizer: Any, args: Any, kwargs: Any
    ) -> Any:
        """torch 2.1 after a compile: ``step`` calls no hooks; the guard runs around it,
        gated as torch's own wrapper is."""
        return self._gates.gate(step)(optimizer, *args, **kwargs)  # finished by the gate

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
        probe = self._zero_probe(record, grads) if not record.suspect else None
        held(record, grads, probe)
        record.pending.append((record.step, PendingFlag(flag, probe)))
        return True


def _scaler_decides(optimizer: Any, kwargs: Any, record: Record) -> bool:
    """GradScaler handed this step to an optimizer that unscales and skips inf steps itself
    (fused Adam/AdamW/SGD): the gradients are still scaled, and an inf is expected."""
    if "grad_scaler" in kwargs:
        return True
    found = getattr(optimizer, "found_inf", None)
    return found is not None and found is not record.flag
