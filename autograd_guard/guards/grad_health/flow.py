"""The step pipeline of grad_health, in the order a step meets it: the gate between torch's
step hooks and the step body calls ``decide`` (after every pre-hook) and ``finish``;
``decide`` runs the common step in one frame (``_quick``) and every other one through
``_check``, and both end in ``_verdict``. What the pipeline hands on, it hands to a part
(see ``Parts``) and gets a verdict back: RUN, SKIP, CLOSURE, or a ``Refused`` (strict).

The common step (``_quick``): one process, a plain optimizer whose every parameter has had
its first gradient, no closure, no GradScaler, gradients whose flag is read at once (not
CUDA's, which the full check may lend to a fused optimizer). In a short step (a small
model on the CPU) the full check's calls cost more than its kernel, so the healthy case
takes this path; everything else (a first step, a lost-gradient window, ranks that decide
together, a localiser armed, a flag lent, a non-finite gradient) the full one. A step with
a closure is checked after each evaluation (``closure``). The pipeline owns what is per
optimizer (``Records``) and which steps are in progress on each thread.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from typing import NamedTuple

from autograd_guard.errors import GuardError, Refused
from autograd_guard.guards.grad_health import skips, zero
from autograd_guard.guards.grad_health.check import PendingFlag
from autograd_guard.guards.grad_health.closure import Closures
from autograd_guard.guards.grad_health.dist import local_gradient
from autograd_guard.guards.grad_health.gate import CLOSURE, RUN, SKIP, Gates
from autograd_guard.guards.grad_health.record import Records
from autograd_guard.guards.grad_health.repair import NONFINITE
from autograd_guard.guards.grad_health.step import closure_of, params_of
from autograd_guard.guards.grad_health.zero import held
from autograd_guard.guards.grad_health.zero_params import in_window

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from autograd_guard.guards.grad_health.check import FiniteCheck, Probe, Slot
    from autograd_guard.guards.grad_health.closure import Evaluation
    from autograd_guard.guards.grad_health.compile import EagerHooks
    from autograd_guard.guards.grad_health.localise import Localiser
    from autograd_guard.guards.grad_health.nonfinite import NonFinite
    from autograd_guard.guards.grad_health.record import Record
    from autograd_guard.guards.grad_health.repair import Repair
    from autograd_guard.guards.grad_health.strict import StrictStop
    from autograd_guard.guards.grad_health.together import Together
    from autograd_guard.guards.grad_health.usage import Usage
    from autograd_guard.guards.grad_health.voice import Voice
    from autograd_guard.guards.grad_health.words import StepSites
    from autograd_guard.guards.grad_health.zero import ZeroWatch


class Parts(NamedTuple):
    """What the pipeline hands a step on to, in the order it may."""

    finite: FiniteCheck  # the one fused check of the gradients (and its device flag)
    usage: Usage  # parameters without a gradient
    together: Together  # the ranks of a model decide together
    repair: Repair  # a repaired pass that made the values again
    zero: ZeroWatch  # every gradient zero, step after step
    nonfinite: NonFinite  # the verdict on a non-finite step, said
    strict: StrictStop  # the stop strict owes since a skipped step
    localiser: Localiser  # the recording after a non-finite step


class StepFlow:
    """What runs at each optimizer step; ``gates`` call it."""

    def __init__(self, voice: Voice, hooks: EagerHooks, sites: StepSites, parts: Parts) -> None:
        self._voice, self._hooks, self._sites, self._parts = voice, hooks, sites, parts
        self._config = voice.config
        self.active = True  # off once the guard is detached
        self.records = Records()
        self._stepping = threading.local()  # steps in progress on this thread
        self._closures = Closures(voice, self._check, self._leave, lambda: self.active)
        self.gates = Gates(self.decide, self.finish, self._closure_step, self._made)

    def restart(self) -> None:
        """A new run in the process: every optimizer starts anew (steps still counted)."""
        records = self.records
        self._close_watches()
        self.records = Records()
        self.records.steps = records.steps

    def stop(self) -> None:
        """The guard is detached: no step is checked, no forward pass watched."""
        self.active = False
        self._close_watches()

    def _close_watches(self) -> None:
        for record in self.records.all():
            skips.remove(record)  # the model's hooks gone (a step left is told no more)
            if record.sharing is not None:
                record.sharing.release()
            if record.first is not None:  # an optimizer that never stepped: its pre-hook
                record.first.remove()
                record.first = None
            if record.watch is not None:
                record.watch.close()
                record.watch = None

    def _made(self, optimizer: Any) -> None:
        """An optimizer is made: its first step, before any pre-hook of the user's, finds
        whether its parameters are shared, so that a pre-hook raising there is told to
        the other ranks at this rank's next forward (``skips``). Never raises."""
        if not self.active or self._voice.mode == "observe" or not self._config["nonfinite"]:
            return
        try:
            handle = optimizer.register_step_pre_hook(self._hooks.eager_method(self._first_step))
            optimizer._optimizer_step_pre_hooks.move_to_end(handle.id, last=False)
        except Exception:  # a torch without these: a first step left waits the timeout
            return
        self.records.get(optimizer).first = handle  # removed by its first gate

    def _first_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The first step's first pre-hook (till a gate removes it): the shared model's
        hooks come now, its backward done (a pre-hook of the user's that raises leaves
        the step). Not for an inner optimizer of a step in progress: its outer one
        speaks for the step."""
        if self._stepping.__dict__.get("depth", 0):
            return
        try:
            record = self.records.get(optimizer)
            if self.active and record.shared_known == -1:
                params = params_of(optimizer)
                self._parts.together.sharing(optimizer, record, params, self.records)
                skips.began(record)
        except Exception as exc:  # its gate finds out again
            with contextlib.suppress(GuardError):
                self._voice.fail("step check", exc)

    def before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The first global pre-hook: gate the optimizer's class (once per class); a class
        with no gate is checked here, where its step can be stopped but not skipped."""
        if not self.active:
            return
        try:
            if self.gates.ensure(type(optimizer)):
                return
            verdict = self.decide(args, kwargs, gated=False)
        except GuardError:
            raise
        except Exception as exc:  # fail open: the optimizer steps as it would unguarded
            self._voice.fail("step check", exc)
            return
        if isinstance(verdict, Refused):  # strict: the step does not run
            raise verdict.error  # autograd-guard strict: the message says why
        self.finish(optimizer, True, False)
        if verdict == CLOSURE:
            self.records.get(optimizer).closure = None  # checked only before the step

    def decide(self, args: Any, kwargs: Any, gated: bool = True) -> object:
        """RUN, SKIP or CLOSURE for the step about to run; in strict, a ``Refused`` that
        its caller raises (from one frame of the guard's)."""
        optimizer = args[0]
        if not self.active:
            return RUN
        record = self.records.get(optimizer)
        if record.depth or self._stepping.__dict__.get("depth", 0):
            if not gated or self.gates.nested():
                self._enter(record)
                return RUN  # super().step(), or an inner optimizer of a step being checked
            record.depth = self._stepping.__dict__["depth"] = 0  # left by an interrupted step
        self._enter(record)
        try:
            self._parts.strict.due(record)  # strict: the op the pass after a skip named
            if record.flag is not None:
                self._step_over(optimizer, record)  # the last step raised before its post-hooks
            verdict = self._quick(optimizer, record, args, kwargs, gated)
            if verdict is None:  # not the common step
                verdict = self._step_starts(optimizer, record, args, kwargs, gated)
        except GuardError as strict:
            self._leave(record)
            return Refused(strict)
        except Exception as exc:
            try:
                self._voice.fail("step check", exc)  # fail open: the step runs
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

    def finish(self, optimizer: Any, leave: bool, after: bool) -> object:
        """A gated step is over, before any post-hook: left (where its body ran, or
        raised), and what comes after a step done (where it did not raise)."""
        record = self.records.find(optimizer)
        if leave and record is not None:
            self._leave(record)
        parts = self._parts
        if (
            after
            and self.active
            and (
                parts.localiser.probe is not None
                or parts.repair.repairer is not None
                or (record is not None and (record.flag is not None or record.pending))
            )
        ):  # else nothing comes after it (a healthy step)
            try:
                self._step_done(optimizer, record)
            except GuardError as strict:  # strict: raised by the gate
                return Refused(strict)
        return None

    def _closure_step(self, body: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        return self._closures.step(body, args, kwargs, self.records.get(args[0]))

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

    def _quick(
        self, optimizer: Any, record: Record, args: tuple[Any, ...], kwargs: Any, gated: bool
    ) -> object | None:
        """The verdict on a common step, or None (nothing done: ``_check`` decides)."""
        if (
            kwargs
            or len(args) > 1  # a closure, or GradScaler's keyword
            or record.site is None  # the first step
            or record.waiting
            or record.watch is not None  # the lost-gradient window
            or record.sharing is not None  # ranks that decide together
            or self._parts.localiser.probe is not None  # the localiser is armed
            or getattr(optimizer, "found_inf", None) is not None  # a flag lent, or GradScaler's
            or not self._config["nonfinite"]
        ):
            return None
        params = params_of(optimizer)
        if record.shared_known != len(params) or (
            len(params) != record.known and self._config["lost_steps"]
        ):
            return None  # parameters added since: the full check registers them
        grads = [g for p in params if (g := p.grad) is not None]  # one read of each
        if not grads or type(grads[0]) is not sys.modules["torch"].Tensor:
            return None
        slot = self._parts.finite.slot(grads[0].device)
        if slot.deferred:  # the flag may stay on the device (CUDA): the full check lends it
            return None
        # as _step_starts and _check do, in their order
        record.step += 1
        self.records.steps += 1
        record.evaluations = 0
        record.empty = 0
        flag = self._parts.zero.probe_for(record, grads)
        return self._verdict(optimizer, record, params, grads, slot, flag, gated, None)

    def _step_starts(
        self, optimizer: Any, record: Record, args: Any, kwargs: Any, gated: bool
    ) -> object:
        record.step += 1
        self.records.steps += 1
        record.evaluations = 0
        record.probed = None  # a step that raised left its gradients there
        if record.site is None:  # once per optimizer: for what is said of it at exit
            record.kind, record.site = type(optimizer).__name__, self._sites.site(optimizer)
            if record.first is not None:  # its first step's pre-hook ran: no more
                record.first.remove()
                record.first = None
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
        parts = self._parts
        params = params_of(optimizer)
        if record.waiting or record.watch is not None or len(params) != record.known:
            parts.usage.check(optimizer, record, params)  # else nothing to do (every step)
        if not self._config["nonfinite"] or _scaler_decides(optimizer, kwargs, record):
            skips.spoke(record)  # no rank exchanges for this step
            parts.usage.no_gradient(optimizer, record, params)
            return RUN
        sharing = record.sharing  # found once per set of parameters
        if record.shared_known != len(params):
            sharing = parts.together.sharing(optimizer, record, params, self.records)
        consumed = sharing.shard if sharing is not None else params
        grads = [g for p in consumed if (g := p.grad) is not None]  # one read of each
        if grads:
            record.empty = 0
        else:  # not a zero step: a streak of them ends ("none missing")
            record.zero_in_a_row = 0
            parts.usage.no_gradient(optimizer, record, params)
        if sharing is not None and self._voice.mode != "observe" and sharing.channel.closed is None:
            return parts.together.decide(
                optimizer, record, consumed, grads, sharing, gated, evaluation
            )
        if not grads:
            return RUN
        first = grads[0]
        plain = type(first) is sys.modules["torch"].Tensor  # not fake tensors and the like
        local = grads if plain else [local_gradient(g) for g in grads]
        if parts.localiser.probe is not None:
            finite = functools.partial(parts.finite.all_finite, local)  # other threads' passes
            mended = parts.repair.mended_verdict(optimizer, record, gated, finite)
            if mended is NONFINITE:  # a mended pass that was no repair: a non-finite step
                return parts.nonfinite.verdict(optimizer, record, [], gated=gated)
            if mended is not None:
                return mended
        slot = parts.finite.slot(first.device) if plain else None
        if slot is not None and slot.deferred:
            parts.zero.suspected(optimizer, record, grads)
            if self._lend_flag(optimizer, record, grads, slot):
                return RUN
        flag = parts.zero.probe_for(record, local) if sharing is None else None
        return self._verdict(optimizer, record, consumed, local, slot, flag, gated, evaluation)

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
        the zero streak counted, or what ``NonFinite`` says. Both paths end here."""
        parts = self._parts
        if parts.finite.all_finite(grads, slot, flag):
            record.in_a_row = 0
            if flag is not None:
                parts.zero.counted(optimizer, record, zero.all_zero(record, grads, flag))
            if record.zero_params is not None and in_window(record, self._config["zero_steps"]):
                parts.zero.window(optimizer, record, consumed)
            return RUN
        bad = [p for p in consumed if p.grad is not None]
        return parts.nonfinite.verdict(optimizer, record, bad, gated=gated, evaluation=evaluation)

    def after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The post-hook, only where some class has no gate: the work after its step."""
        if self.active and not self.gates.ensure(type(optimizer)):
            self._step_done(optimizer, self.records.find(optimizer))

    def _step_done(self, optimizer: Any, record: Record | None) -> None:
        try:
            if record is not None and (record.flag is not None or record.pending):
                self._step_over(optimizer, record, ended=True)
            self._parts.localiser.step_done()
            self._parts.repair.step_done()
        except Exception as exc:  # fail open
            self._voice.fail("after step", exc)

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
                    self._parts.zero.read_flag(optimizer, record, probed if own else None)
            elif step == record.step:  # read in its own step: its gradients are current
                params = [p for p in params_of(optimizer) if p.grad is not None]
                self._parts.nonfinite.verdict(optimizer, record, params, on_device=True)
            else:
                self._parts.nonfinite.verdict(optimizer, record, [], on_device=True)

    def run_unhooked_step(
        self, step: Callable[..., Any], optimizer: Any, args: Any, kwargs: Any
    ) -> Any:
        """torch 2.1 after a compile: ``step`` calls no hooks; the guard runs around it,
        gated as torch's own wrapper is."""
        return self.gates.gate(step)(optimizer, *args, **kwargs)  # finished by the gate

    def _lend_flag(self, optimizer: Any, record: Record, grads: list[Any], slot: Slot) -> bool:
        """On a device where reading the flag means a host sync (CUDA): a fused optimizer
        takes it (fix) and skips the step itself; ``observe`` reads it steps later. Not on
        a parameter's first step: fused SGD's kernel, skipping, leaves the momentum buffer
        it just made uninitialised."""
        mode = self._voice.mode
        lend = (
            mode == "fix"
            and getattr(optimizer, "_step_supports_amp_scaling", False)
            and len(optimizer.state) >= len(grads)
        )
        if not (lend or mode == "observe"):
            return False
        flag = self._parts.finite.device_flag(grads, slot)
        if flag is None:
            return False
        if lend:
            optimizer.found_inf = record.flag = flag
        probe = self._parts.zero.probe_for(record, grads) if not record.suspect else None
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
