"""grad_health's localiser: after a non-finite step, the next backward passes are recorded
(``probe``) to name the backward op that first made the value and the forward line that
ran it, or the forward op that made a value the forward pass already held, or why neither
could be found. One recording at a time, for the whole process; at most ``PROBES`` per
run (a recording may find nothing: another thread's passes).

Every pointer in an event leads somewhere: the remedy of a non-finite step names the
``nonfinite_origin`` event only while a recording is armed for it (or one may still be),
and that event always comes (the op, or why it was not found, at the latest at exit).
"""

from __future__ import annotations

import threading

from autograd_guard.guards.grad_health.advice import advice
from autograd_guard.guards.grad_health.findings import (
    DETECT,
    FIND_IT,
    LOSS_REMEDY,
    MADE_REMEDY,
    MAKE_SAFE,
    ORIGIN_REMEDY,
    short,
)
from autograd_guard.guards.grad_health.made import LEAF, SPECTRAL, SPECTRAL_REMEDY, declined_words
from autograd_guard.guards.grad_health.probe import BackwardProbe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from autograd_guard.guards.grad_health.compile import EagerHooks
    from autograd_guard.guards.grad_health.voice import Voice
    from autograd_guard.guards.grad_health.words import StepSites

PROBES = 3  # recordings per run


class Localiser:
    """Owns the recording in progress (``probe``), the step that armed it (``site``) and
    how many are left; says ``nonfinite_origin`` when one is over."""

    def __init__(self, voice: Voice, hooks: EagerHooks, sites: StepSites) -> None:
        self._voice, self._hooks, self._sites = voice, hooks, sites
        self.probe: BackwardProbe | None = None
        self.site: str | None = None  # the step whose gradients armed it
        self._left = PROBES
        self._lock = threading.Lock()

    def remedy(self, find_it: bool) -> str:
        """What to do about a non-finite step, pointing only at events that will come;
        ``find_it``: strict's stop, where no recording will follow."""
        if find_it:
            return f"find the op that made the value: {FIND_IT}; then {MAKE_SAFE}"
        if self._voice.config["localize_steps"] and (self.probe is not None or self._left):
            return (
                "the next backward passes are recorded to name the op that made the value "
                f"(a nonfinite_origin event follows: the op, or why it was not found); {MAKE_SAFE}"
            )
        return f"torch.autograd.detect_anomaly() around the failing step names the op; {MAKE_SAFE}"

    def arm(self, site: str, repairs: bool, shared: bool = False) -> None:
        """Record the next passes to name the op (not in strict: see ``arm_once``). Where
        fix repairs (``repairs``), the passes go on until two name the same node, and each
        is mended as it is recorded; never where ranks decide together (``shared``): a
        mended pass on one rank is a change the others do not make."""
        voice = self._voice
        passes = voice.config["localize_steps"]
        if voice.mode == "strict" or not passes:
            return
        with self._lock:
            if self.probe is None and self._left > 0:
                self._left -= 1
                probe = BackwardProbe(passes, passes + 2, self._hooks.eager)
                probe.confirm = repairs and voice.mode in ("fix", "observe") and not shared
                probe.mend = probe.confirm and voice.mode == "fix"
                probe.ranks = repairs and voice.mode in ("fix", "observe") and shared
                probe.arm()
                self.probe, self.site = probe, site

    def arm_once(self, site: str, steps: int) -> BackwardProbe | None:
        """strict: record the next backward pass alone (over at most ``steps`` optimizer
        steps); None where a recording is on already, or none is left."""
        with self._lock:
            if self.probe is not None or self._left <= 0:
                return None
            self._left -= 1
            probe = BackwardProbe(1, steps, self._hooks.eager)
            probe.arm()
            self.probe, self.site = probe, site
            return probe

    def step_done(self) -> None:
        """An optimizer step is over: a recording that is done says what it found; one
        whose thread has ended, or that its timer disarmed, ends at any thread's step."""
        probe = self.probe
        if probe is None:
            return
        if probe.step_done() if probe.mine() else probe.orphaned():
            probe.disarm()
            self.finished(probe)

    def stop(self, at_exit: bool = False) -> None:
        """The recording in progress ends now, and says what it found."""
        probe = self.probe
        if probe is not None:
            probe.disarm()
            self.finished(probe, at_exit=at_exit)

    def detach(self) -> None:
        with self._lock:
            if self.probe is not None:
                self.probe.disarm()
                self.probe = None

    def finished(self, probe: BackwardProbe, at_exit: bool = False) -> None:
        """``probe`` is over: ``nonfinite_origin`` (the op, or why it was not found)."""
        with self._lock:
            if self.probe is not probe:
                return
            self.probe = None
            if probe.origin is not None or probe.tainted:  # later passes would say no more
                self._left = 0
        if probe.error is not None:
            self._voice.fail("localise", probe.error)
            self._unknown("the localiser failed (a guard_error event says why)")
        elif probe.tainted:
            self._made_in_forward(probe)
        elif probe.origin is not None:
            op, line = probe.origin
            known = advice(op, probe.frames)  # a library function's known singular point
            within = f" in {known[0]}" if known else ""
            remedy, declined = known[1] if known else ORIGIN_REMEDY, _declined(probe)
            if declined and probe.declined in SPECTRAL and not known:
                remedy = SPECTRAL_REMEDY
            site = self.site or self._sites.site(None)
            self._voice.emit(
                f"the first non-finite gradient came out of {op}, the backward of line "
                f"{short(line, site)}{within}; seen by the optimizer step{declined}",
                action="nonfinite_origin",
                callsite=site,
                remedy=remedy,
                op=op,
                forward=line,
                within=known[0] if known else None,
            )
        elif at_exit and not probe.recorded:
            self._unknown("the run ended before another backward pass in the thread of that step")
        elif not probe.recorded:  # passes are recorded in the thread of the step alone
            self._unknown(
                "no backward pass ran in the thread of that step while it watched (a pass "
                "in another thread is not recorded)"
            )
        else:
            self._unknown(
                f"the next {probe.recorded} backward pass(es) had no non-finite gradient (a "
                "one-off value: one bad batch or sample?)"
            )

    def _made_in_forward(self, probe: BackwardProbe) -> None:
        """The forward pass held the value already: the op that made it, or why no op did."""
        if not probe.loss_finite and (probe.made is None or probe.made[0] != LEAF):
            self._voice.emit(
                "the op that made the non-finite gradient is no backward op: the next "
                "backward pass began at a non-finite loss (NaN or inf), made in the forward "
                "pass. A non-finite loss is never repaired (fix skips its steps)",
                action="nonfinite_origin",
                callsite=self.site or self._sites.site(None),
                remedy=LOSS_REMEDY,
            )
            return
        declined = _declined(probe)
        if probe.made is None and probe.origin is not None:  # the weights came in finite
            self._unknown(
                f"the next backward pass ran on a forward value that was already non-finite "
                f"when {probe.origin[0]} used it: made by an op the localiser could not name, "
                f"or held by an input that does not require grad{declined}"
            )
            return
        if probe.made is None or probe.made[0] == LEAF or probe.origin is None:
            let = (
                "observe let steps with non-finite gradients through, which may have made "
                "them non-finite"
                if self._voice.mode == "observe"
                else "no checked step made them: fix skips every step with non-finite gradients"
            )
            self._unknown(
                "the next backward pass ran on values that were already non-finite when they "
                f"entered the forward pass (weights or inputs: {let}), so no op there made them"
            )
            return
        (made, at), (op, line) = probe.made, probe.origin
        dropped = ", and the loss left it out" if probe.loss_finite else ""
        self._voice.emit(
            f"the forward pass already held a non-finite value: {made} on line {at} made it"
            f"{dropped}; the first non-finite gradient came out of {op}, the backward of the "
            f"forward operation on line {line}, which used that value{declined}",
            action="nonfinite_origin",
            callsite=self.site or self._sites.site(None),
            remedy=MADE_REMEDY,
            op=op,
            forward=line,
            made=made,
            made_at=at,
        )

    def _unknown(self, why: str) -> None:
        find = FIND_IT if self._voice.mode != "fix" else "wrap the failing step in " + DETECT
        self._voice.emit(
            f"the op that made the non-finite gradient could not be found: {why}",
            action="nonfinite_origin",
            callsite=self.site or self._sites.site(None),
            remedy=find,
        )


RANKS = (
    "Repair does not begin where the ranks of a model decide a step together (a gradient "
    "mended on one rank is a change the others would not make): fix skips such steps on "
    "every rank; make the op safe for gradients to train through it"
)


def _declined(probe: BackwardProbe) -> str:
    """Why repair does not begin at the node found, where fix would repair (said after the
    origin); "" elsewhere."""
    if probe.declined is not None and (probe.confirm or probe.ranks):
        return f". {declined_words(probe.declined)}"
    return f". {RANKS}" if probe.ranks else ""
