"""grad_health's strict stop that names the op: strict is the mode of CI, where the op that
made a non-finite gradient is the most useful fact, and raising at the first non-finite step
left it unknown.

So at the first such step strict skips the step, as fix does (its body never runs: the
weights, the optimizer's state and ``param_groups`` as before it), and records the next
backward pass with the localiser (the cost of ``torch.autograd.detect_anomaly()`` for that
one pass); the next optimizer step raises ``GuardError`` before it runs, naming the op and
its forward line (or why it was not found: a one-off value), with the weights still
unchanged. Not a step that the ranks of a model decide together (or an optimizer's first
step, where that is not known yet), unless it is the skipped optimizer's own: a rank's local
optimizer skipped beside a shared one must not stop the shared loop on that rank alone (the
others would wait for it); the shared step runs as it would, and the local optimizer's next
step raises. Nor another optimizer's step before any backward pass since the skip (one loss,
two optimizers stepped back to back): nothing is named yet; a non-finite step there is
skipped too, and said. A run that ends before such a step ends
with exit status 3, said at exit.
Where a step cannot be skipped (a closure's evaluation, an optimizer class with no gate,
ranks that decide together, a flag left on the device) or ``localize_steps = 0``, strict
raises at the first non-finite step, as before.
"""

from __future__ import annotations

from autograd_guard.guards.grad_health.findings import MAKE_SAFE, short, strict_finding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from autograd_guard.guards.grad_health.localise import Localiser
    from autograd_guard.guards.grad_health.probe import BackwardProbe
    from autograd_guard.guards.grad_health.record import Record
    from autograd_guard.guards.grad_health.voice import Voice

STEPS = 16  # the recording's bound in optimizer steps (of any optimizer) with no backward pass

SKIPPED = "this {kind} step was skipped (weights, optimizer state and param_groups as before it)"
RAISED = (
    ", the next backward pass recorded, and the run stopped at the next step, before the "
    "weights changed"
)
ENDED = "; the run ended before another step (exit status 3)"


class Deferred:
    """A stop strict owes: the optimizer's record, its recording, and what to say."""

    __slots__ = ("kind", "names", "probe", "record", "site", "what")

    def __init__(
        self, record: Record, probe: BackwardProbe, kind: str, stop: tuple[str, str, Any]
    ) -> None:
        self.record, self.probe, self.kind = record, probe, kind
        self.what, self.site, self.names = stop


class StrictStop:
    """``defer`` at a non-finite step; ``due`` at that optimizer's next one (or the exit)."""

    def __init__(self, voice: Voice, localiser: Localiser) -> None:
        self._voice, self._localiser = voice, localiser
        self.pending: Deferred | None = None

    def defer(
        self, optimizer: Any, record: Record, stop: tuple[str, str, Any], when: tuple[Any, ...]
    ) -> bool:
        """Skip this step and record the next pass; False where the step is to be stopped
        at once (see the module's docstring). ``stop``: what, where, the names; ``when``:
        whether the step is gated, its closure's evaluation, its sharing."""
        gated, evaluation, sharing = when
        if (
            not gated
            or evaluation is not None
            or sharing is not None
            or record.sharing is not None
            or not self._voice.config["localize_steps"]
        ):
            return False
        if self.pending is not None:  # another optimizer's step skipped before this one
            if self.pending.probe.recorded:  # the op is named by now: this step stops
                return False
            self._skipped(optimizer, stop)  # no pass since (one loss, two optimizers)
            return True
        probe = self._localiser.arm_once(stop[1], STEPS)  # one pass; other optimizers'
        if probe is None:  # steps before it do not end it
            return False
        self.pending = Deferred(record, probe, type(optimizer).__name__, stop)
        self._skipped(optimizer, stop)
        return True

    def _skipped(self, optimizer: Any, stop: tuple[str, str, Any]) -> None:
        what, site, names = stop
        self._voice.emit(
            f"{what}: this {type(optimizer).__name__} step was skipped (weights, optimizer "
            "state and param_groups as before it); strict records the next backward pass to "
            "name the op, and the next step raises",
            action="nonfinite_gradient",
            callsite=site,
            level="error",
            parameters=names,
            remedy=self._localiser.remedy(find_it=False),
        )

    def due(self, record: Record) -> None:
        """The next step (``record``'s: not one the ranks decide together, unless it is the
        deferring optimizer's own): the op the recorded pass named, and the stop, raised."""
        pending = self.pending
        if pending is None:
            return
        if record is not pending.record and (
            record.sharing is not None  # a shared step runs on every rank (see above)
            or record.site is None  # a first step: whether it is shared is not known yet
            or not pending.probe.recorded  # no backward pass since: nothing to name yet
        ):
            return
        self.pending = None
        self._say(pending, at_exit=False)

    def exit(self) -> None:
        """The run ended before that step: the stop, logged, and exit status 3."""
        pending, self.pending = self.pending, None
        if pending is not None:
            self._say(pending, at_exit=True)

    def _say(self, pending: Deferred, at_exit: bool) -> None:
        probe, what, site = pending.probe, pending.what, pending.site
        remedy = self._localiser.remedy(find_it=True)
        recording = self._localiser.probe is probe  # else over at another optimizer's step
        if recording:
            probe.disarm()
            self._localiser.finished(probe, at_exit=at_exit)  # the op, or why not
        if probe.origin is not None:
            op, line = probe.origin
            what += f", made by {op} (the backward of line {short(line, site)})"
            remedy = MAKE_SAFE
        event = f"{what}: {SKIPPED.format(kind=pending.kind)}{ENDED if at_exit else RAISED}"
        fields = {"action": "nonfinite_gradient", "callsite": site, "parameters": pending.names}
        if not at_exit:
            self._voice.refuse(event, remedy=remedy, **fields)
        self._voice.emit(event, level="error", remedy=remedy, always=True, **fields)
        strict_finding()
