"""grad_health's findings and the advice that goes with them: where a non-finite value
came from (or why that could not be found, and what will find it), parameters that never
get a gradient, a run that has stopped training (non-finite steps in a row) or learns
nothing (every gradient exactly zero, step after step); and, in strict, a run that ends with a
finding ends with a non-zero status.

A mixin of ``GradHealth``. Every pointer in an event leads somewhere: the remedy of a
non-finite step names the ``nonfinite_origin`` event only while a localiser is armed for
it, and that event always comes (the op, or why it could not be found, at the latest at
exit).
"""

from __future__ import annotations

import threading

from autograd_guard.guards.grad_health import zero_params
from autograd_guard.guards.grad_health.advice import advice
from autograd_guard.guards.grad_health.check import parameter_names
from autograd_guard.guards.grad_health.dist import user_names
from autograd_guard.guards.grad_health.made import LEAF
from autograd_guard.guards.grad_health.probe import BackwardProbe
from autograd_guard.guards.grad_health.zero import event as zero_event
from autograd_guard.guards.grad_health.zero import zero_remedy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar, NoReturn

    from autograd_guard._common.environment import Mode
    from autograd_guard.guards.grad_health.compile import EagerHooks
    from autograd_guard.guards.grad_health.record import Record, Records
    from autograd_guard.guards.grad_health.words import StepSites

MAKE_SAFE = (
    "make that op safe for gradients (sqrt(x + eps), clamp its input, torch.where on a "
    "safe input) or lower the learning rate"
)
DETECT = "torch.autograd.detect_anomaly() (it raises at the op, at 2-3x the step's cost)"
FIND_IT = (
    "run with AUTOGRAD_GUARD=fix, which keeps the weights finite and names the backward op "
    f"and forward line if the value comes again, or wrap the failing step in {DETECT}"
)
ORIGIN_REMEDY = (
    "make that forward operation safe for gradients: add an epsilon (sqrt(x + eps)), "
    "clamp its input, or compute it with torch.where on a safe input"
)
MADE_REMEDY = (
    "keep that forward value finite even where the loss drops it: a fully masked softmax "
    "row needs a finite fill (or torch.where on the scores), log(x) a clamp(min=eps) or "
    "torch.where on a safe input, x / y a safe denominator"
)
STALL_REMEDY = (
    "stop the run and fix the op that makes the non-finite value, or resume from a "
    "checkpoint: a step with non-finite gradients does not train"
)
EXIT_STATUS = 3  # strict: a run that ended with a finding


class Findings:
    """The findings half of ``GradHealth``."""

    name: ClassVar[str]
    mode: Mode
    config: dict[str, Any]
    _records: Records
    _hooks: EagerHooks
    _sites: StepSites
    _probe: BackwardProbe | None
    _probe_site: str | None  # the step whose gradients armed it
    _probes_left: int
    _probe_lock: threading.Lock
    emit: Callable[..., bool]
    fail: Callable[[str, BaseException], None]
    refuse: Callable[..., NoReturn]
    _usage_at_exit: Callable[[Record], None]
    _repairs: Callable[[], bool]
    _repair_exit: Callable[[], None]
    _repairer: Any
    _loss_finished: Callable[[str], None]
    _stop_pending: Callable[..., None]

    def _nonfinite_remedy(self) -> str:
        """What to do, pointing only at events that will come."""
        if self.mode == "strict" and getattr(self, "_pending_stop", None) is None:
            return f"find the op that made the value: {FIND_IT}; then {MAKE_SAFE}"
        if self.config["localize_steps"] and (self._probe is not None or self._probes_left):
            return (
                "the next backward passes are recorded to name the op that made the value "
                f"(a nonfinite_origin event follows: the op, or why it was not found); {MAKE_SAFE}"
            )
        return f"torch.autograd.detect_anomaly() around the failing step names the op; {MAKE_SAFE}"

    def _stalled(self, record: Record, site: str) -> None:
        """Said when the stall starts and again each time its length doubles."""
        skipped = "each was skipped" if self.mode == "fix" else "in " + self.mode
        event = (
            f"{record.in_a_row} optimizer steps in a row had non-finite gradients ({skipped}; "
            f"{record.skipped} of {record.step} steps of this optimizer skipped): training "
            "is not progressing"
        )
        instead = ' (on_stall = "raise" stops the run instead)'
        self._say_stall(event, site, record.in_a_row, STALL_REMEDY, instead)

    def _say_stall(self, event: str, site: str, steps: int, remedy: str, note: str = "") -> None:
        """A ``training_stalled`` error: raised where ``on_stall = "raise"``, else logged
        (``note`` added to its remedy), whatever the mode."""
        if self.config["on_stall"] == "raise":
            self.refuse(event, action="training_stalled", callsite=site, remedy=remedy)
        self.emit(
            event,
            action="training_stalled",
            callsite=site,
            level="error",
            remedy=remedy + note,
            steps=steps,
            always=True,
        )

    def _zero_streak(self, optimizer: Any, record: Record, ranks: list[int] | None) -> None:
        """Every gradient exactly zero for ``zero_steps`` steps: once per streak, a warning
        in every mode (the steps themselves are not touched)."""
        steps = record.zero_in_a_row
        self.emit(
            zero_event(type(optimizer).__name__, steps, ranks),
            action="zero_gradient",
            callsite=self._sites.site(optimizer),
            remedy=zero_remedy(),
            steps=steps,
            ranks=ranks,
            optimizer=type(optimizer).__name__,
        )

    def _zero_window(self, optimizer: Any, record: Record, params: list[Any]) -> None:
        """An optimizer's first ``zero_steps`` finite steps: each one's gradients kept; at
        the last, the parameters whose gradient was exactly zero throughout, named once (a
        warning in every mode)."""
        steps = self.config["zero_steps"]
        zero_params.keep(record, params)
        if record.step < steps or record.sharing is not None:
            return
        zero = zero_params.zero_throughout(record, steps)
        if zero:
            names = user_names(zero, parameter_names(zero), [p.grad for p in zero])
            self.emit(
                zero_params.event(type(optimizer).__name__, names, steps),
                action="zero_gradient_parameter",
                callsite=self._sites.site(optimizer),
                remedy=zero_params.REMEDY,
                parameters=names,
                steps=steps,
                optimizer=type(optimizer).__name__,
            )

    def _arm_probe(self, site: str, shared: bool = False) -> None:
        """Record the next passes to name the op. Repair is for one process: where ranks
        decide together (``shared``), the probe only names the op, never mends a pass."""
        passes = self.config["localize_steps"]
        if self.mode == "strict" or not passes:
            return
        with self._probe_lock:
            if self._probe is None and self._probes_left > 0:
                self._probes_left -= 1
                probe = BackwardProbe(passes, passes + 2, self._hooks.eager)
                probe.confirm = self._repairs() and self.mode in ("fix", "observe")
                probe.confirm = probe.confirm and not shared
                probe.mend = probe.confirm and self.mode == "fix"
                probe.arm()
                self._probe, self._probe_site = probe, site

    def _probe_finished(self, probe: BackwardProbe, at_exit: bool = False) -> None:
        with self._probe_lock:
            if self._probe is not probe:
                return
            self._probe = None
            if probe.origin is not None or probe.tainted:  # later passes would say no more
                self._probes_left = 0
        if probe.error is not None:
            self.fail("localise", probe.error)
            self._origin_unknown("the localiser failed (a guard_error event says why)")
        elif probe.tainted:
            self._made_in_forward(probe)
        elif probe.origin is not None:
            op, line = probe.origin
            known = advice(op, probe.frames)  # a library function's known singular point
            within = f" in {known[0]}" if known else ""
            site = self._probe_site or self._sites.site(None)
            self.emit(
                f"the first non-finite gradient came out of {op}, the backward of line "
                f"{_short(line, site)}{within}; seen by the optimizer step",
                action="nonfinite_origin",
                callsite=site,
                remedy=known[1] if known else ORIGIN_REMEDY,
                op=op,
                forward=line,
                within=known[0] if known else None,
            )
        elif at_exit and not probe.recorded:
            self._origin_unknown("the run ended before another backward pass")
        else:
            self._origin_unknown(
                f"the next {probe.recorded} backward pass(es) had no non-finite gradient (a "
                "one-off value: one bad batch or sample?)"
            )

    def _made_in_forward(self, probe: BackwardProbe) -> None:
        """The forward pass held the value already: the op that made it, or why no op did."""
        if probe.made is None or probe.made[0] == LEAF or probe.origin is None:
            let = (
                "observe let steps with non-finite gradients through, which may have made "
                "them non-finite"
                if self.mode == "observe"
                else "no checked step made them: fix skips every step with non-finite gradients"
            )
            self._origin_unknown(
                "the next backward pass ran on values that were already non-finite when they "
                f"entered the forward pass (weights or inputs: {let}), so no op there made them"
            )
            return
        (made, at), (op, line) = probe.made, probe.origin
        dropped = ", and the loss left it out" if probe.loss_finite else ""
        self.emit(
            f"the forward pass already held a non-finite value: {made} on line {at} made it"
            f"{dropped}; the first non-finite gradient came out of {op}, the backward of the "
            f"forward operation on line {line}, which used that value",
            action="nonfinite_origin",
            callsite=self._probe_site or self._sites.site(None),
            remedy=MADE_REMEDY,
            op=op,
            forward=line,
            made=made,
            made_at=at,
        )

    def _origin_unknown(self, why: str) -> None:
        find = FIND_IT if self.mode != "fix" else "wrap the failing step in " + DETECT
        self.emit(
            f"the op that made the non-finite gradient could not be found: {why}",
            action="nonfinite_origin",
            callsite=self._probe_site or self._sites.site(None),
            remedy=find,
        )

    def settle(self) -> None:
        """The end of one run inside the process (a test of a guarded pytest session):
        what the exit would say of the optimizers seen so far is said now, and they are
        forgotten (each test is a run of its own; an optimizer that lives on starts anew)."""
        self._at_exit()
        records = self._records
        for record in records.all():
            if record.watch is not None:
                record.watch.close()
                record.watch = None
        self._records = type(records)()
        self._records.steps = records.steps
        self._repairer = None

    def _at_exit(self) -> None:
        """The run is over: an armed localiser's last word, and parameters (or whole
        optimizers) that got no gradient in a run shorter than ``lost_steps``."""
        self._stop_pending(at_exit=True)  # strict: a deferred stop no step raised
        probe = self._probe
        if probe is not None:
            probe.disarm()
            self._probe_finished(probe, at_exit=True)
        self._loss_finished("the run ended before another forward pass")
        self._repair_exit()
        for record in self._records.all():
            self._usage_at_exit(record)
            if record.skipped:
                self.emit(
                    f"{record.skipped} of {record.step} optimizer steps of this {record.kind} "
                    "were skipped (non-finite gradients)",
                    action="steps_skipped",
                    callsite=record.site or "-",
                    level="error" if record.skipped == record.step else "warning",
                    steps=record.step,
                    skipped=record.skipped,
                    remedy="the nonfinite_gradient events name the parameters; a skipped "
                    "step does not train",
                )
        self._records.over = True  # what is freed from now on says nothing (shutdown)


def _short(line: str, site: str) -> str:
    """``file:line`` as ``line N`` where the file is the call site's (said beside it)."""
    file, _, number = line.rpartition(":")
    return number if file and file == site.rpartition(":")[0] else line


def _strict_finding() -> None:
    """strict: the process ends with a non-zero status, whatever else it did."""
    from autograd_guard._events import events as _events

    _events.fail_at_exit(EXIT_STATUS)
