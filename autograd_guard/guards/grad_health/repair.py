"""grad_health's repair at the origin: a singular point where the parameters sit.

Symptom: a gradient that is non-finite at one point of an op that the run keeps meeting
(the norm of a rotation vector at exactly 0, a rotation fit that starts at the identity;
softmax over an attention row that the masks together mask fully; ``log`` of an exact 0
in a soft distance transform). Skipping is right for a one-off bad batch, but here every
step is non-finite: fix skips them all, ``training_stalled`` fires, the run ends untrained.
Users' own fixes (``torch.where`` on a safe input, ``clamp``, ``+ eps``, a Taylor branch)
all give that point a finite gradient, usually the limit, and for a masked row exactly 0.
Remedy (fix, ``nonfinite_fix = "repair"``): once the localiser has traced the non-finite
values to the same backward node in two passes in a row, at the optimizer's third
non-finite step in a row (a one-off batch stays a plain skip, and so do several models
meeting one bad batch), that step and every later backward pass have that node's
non-finite outputs set to 0, and the steps run. Only while the loss is finite: a
non-finite loss (or a non-finite forward value the loss uses) is a divergence, never
repaired; those steps stay skipped. The mending is a few kernels per hooked node, on the
device, with no host read: whether a pass changed a value, and its loss, are read once
they are ready (``PendingFlag``), never by waiting. A repair that has run ``stall_steps``
steps without the loss falling has stalled: it is said as ``training_stalled``, and it
stops (later such steps are skipped again). A repair whose loss rises back above its value
when the repair began, stays there for ``stall_steps`` (at least 12) mended passes and
rises through them, is making the run worse than skipping would have (skipping keeps the
weights where they were), unless the loss itself changed: said once as ``repair_worse``
(a warning), and the repair goes on. A repair that has changed nothing for 20 passes in a
row stands down (the run has left the singular point; should it come back,
it is found and confirmed again). observe's ``nonfinite_gradient`` says what fix would
do.
"""

from __future__ import annotations

from autograd_guard.guards.grad_health.findings import say_stall
from autograd_guard.guards.grad_health.gate import RUN
from autograd_guard.guards.grad_health.mending import LOSS, REST, Repairer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from autograd_guard.guards.grad_health.compile import EagerHooks
    from autograd_guard.guards.grad_health.localise import Localiser
    from autograd_guard.guards.grad_health.probe import BackwardProbe
    from autograd_guard.guards.grad_health.record import Record
    from autograd_guard.guards.grad_health.voice import Voice
    from autograd_guard.guards.grad_health.words import StepSites

NONFINITE = object()  # the verdict "a non-finite step after all": the caller says it
RECURS = 3  # non-finite steps in a row of one optimizer, the last repaired
REPAIRED = (
    "from step {step} on, the non-finite gradient that {op} (the backward of the forward "
    "operation on line {line}) made in {passes} backward passes in a row is repaired at "
    "that op: its non-finite outputs are set to 0 (a node that sums over a forward value "
    "the loss left out is computed again with that value as 0): the limit torch.where or "
    "clamp on a safe input would give, and the step runs. The gradient was changed: it is "
    "not the derivative at that point"
)
WOULD_FIX = (
    "skip it, and once the same backward op makes such values again, set them to 0 there "
    "and run the step (nonfinite_fix)"
)
REPAIR_REMEDY = (
    "make that op safe for gradients (torch.where on a safe input, clamp, + eps, a Taylor "
    'branch) to get the true limit; nonfinite_fix = "skip" skips such steps instead'
)
STALLED = (
    "{steps} optimizer steps ran with {op}'s gradient repaired and the loss has not fallen: "
    "0 is not the right limit there, or the parameters behind it are stuck; repair stopped "
    "(such steps are skipped again)"
)
WORSE = (
    "the loss of the last {steps} repaired backward passes stayed above {first:.4g}, its "
    "value where the repair of {op} began, and rose through them (the latest: {last:.4g}): "
    "skipping those steps would have kept the weights where they were then. Unless the "
    "loss itself changed (a schedule, a harder data stream), the repaired gradient makes "
    "the run worse than skipping would: 0 may not be the right limit there. The repair "
    "goes on"
)
WORSE_REMEDY = (
    'nonfinite_fix = "skip" skips such steps instead; or make that op safe for gradients '
    "with its true limit (a function-level backward, torch.where on a safe input, a Taylor "
    "branch), or keep the run away from that point"
)
STUCK = (
    "{steps} optimizer steps ran with {op}'s gradient repaired and the parameters behind it "
    "have not moved since: right where they sit at their optimum; otherwise 0 is not the "
    "right limit there and they are stuck (the loss still falls: repair goes on)"
)


class Repair:
    """When a repair begins, what is said, when it stops; owns the ``Repairer`` (the
    hooks that mend the passes) and whether repair has stopped for the run."""

    def __init__(
        self, voice: Voice, hooks: EagerHooks, sites: StepSites, localiser: Localiser
    ) -> None:
        self._voice, self._hooks, self._sites, self._localiser = voice, hooks, sites, localiser
        self.repairer: Repairer | None = None
        self._stopped = False  # a repair stalled: such steps are skipped again

    def repairs(self) -> bool:
        return self._voice.config["nonfinite_fix"] == "repair" and not self._stopped

    def mended_verdict(
        self, optimizer: Any, record: Record, gated: bool, finite: Callable[[], bool]
    ) -> object | None:
        """The step after a probe pass that mended its gradients: repaired (RUN: the same
        node made them again, and ``finite()``: no other pass left them non-finite), or
        ``NONFINITE``: the non-finite step it was; None where no pass was mended."""
        probe = self._localiser.probe
        if probe is None or not probe.mended or not probe.mine():  # another thread's pass
            return None
        probe.mended = False
        # a recurrence in time: this optimizer's own third non-finite step in a row (not
        # several models' passes of one bad batch, each on the same line)
        recurs = record.in_a_row >= RECURS - 1
        if (
            self._voice.mode == "fix"
            and probe.confirmed()
            and recurs
            and self.repairs()
            and gated
            and finite()
        ):
            self._begins(optimizer, record, probe)
            record.in_a_row = 0
            return RUN
        return NONFINITE

    def _begins(self, optimizer: Any, record: Record, probe: BackwardProbe) -> None:
        repairer = self.repairer
        if repairer is None:
            repairer = self.repairer = Repairer(self._hooks.eager)
        repairer.keys |= probe.makers  # armed once the probe has put torch's functions back
        repairer.watch(probe.behind)
        repairer.quiet = 0
        repairer.repaired += 1  # this step's pass was mended by the probe
        repairer.first = repairer.best = probe.loss  # the weights as skipping keeps them
        op, line = probe.origin or ("<unknown>", "<unknown>")
        repairer.site = self._sites.site(optimizer)
        self._voice.emit(
            REPAIRED.format(step=record.step, op=op, line=line, passes=len(probe.keys)),
            action="nonfinite_repaired",
            callsite=self._sites.site(optimizer),
            remedy=REPAIR_REMEDY,
            op=op,
            forward=line,
            step=record.step,
            ops=sorted({key[0] for key in probe.makers}),
        )

    def step_done(self) -> None:
        """After a step: read what the repaired passes say; a stalled repair stops. The
        repairer patches and unpatches torch's functions only while no probe has (each
        puts back what it found only where it is still on top)."""
        repairer = self.repairer
        if repairer is None or self._localiser.probe is not None or self._stopped:
            return
        if not repairer.armed:
            if repairer.keys and repairer.quiet < REST:
                repairer.arm()
            return
        repairer.drain()
        if repairer.quiet >= REST:  # the singular point is behind: healthy steps pay nothing
            repairer.disarm()
            return
        steps = self._voice.config["stall_steps"]
        what = repairer.stalled(steps)
        if what is not None:
            self._stalled(repairer, what)
        elif judged := repairer.worse(steps):
            self._worse(repairer, judged)

    def _stalled(self, repairer: Repairer, what: str) -> None:
        """The loss has not fallen: a stall, and the repair stops. The parameters behind
        the op have not moved: a warning (the repair goes on while the loss falls)."""
        op, site = ", ".join(sorted({key[0] for key in repairer.keys})), repairer.site
        if what != LOSS:
            self._voice.emit(
                STUCK.format(steps=repairer.repaired, op=op),
                action="repair_stuck",
                callsite=site,
                remedy=REPAIR_REMEDY,
                steps=repairer.repaired,
            )
            return
        repairer.disarm()
        self._stopped = True
        event = STALLED.format(steps=repairer.repaired, op=op)
        say_stall(self._voice, event, site, repairer.repaired, REPAIR_REMEDY)

    def _worse(self, repairer: Repairer, passes: int) -> None:
        """The loss has risen back above where the repair began and goes on rising through
        the last ``passes``: said once (a warning; the loss may have changed by itself)."""
        op = ", ".join(sorted({key[0] for key in repairer.keys}))
        first, last = repairer.first or 0.0, repairer.above[-1]
        self._voice.emit(
            WORSE.format(steps=passes, op=op, first=first, last=last),
            action="repair_worse",
            callsite=repairer.site,
            remedy=WORSE_REMEDY,
            steps=repairer.repaired,
        )

    def forget(self) -> None:
        """A new run in the process (``settle``): the repairer is dropped, unsaid."""
        self.repairer = None

    def detach(self) -> None:
        if self.repairer is not None:
            self.repairer.disarm()

    def exit(self) -> None:
        repairer = self.repairer
        if repairer is None:
            return
        repairer.disarm()
        repairer.drain()
        if repairer.repaired:
            ops = sorted({key[0] for key in repairer.keys})
            self._voice.emit(
                f"{repairer.repaired} optimizer steps ran with a gradient repaired at "
                f"{', '.join(ops)}",
                action="steps_repaired",
                callsite=repairer.site,
                remedy=REPAIR_REMEDY,
                steps=repairer.repaired,
                ops=ops,
            )
