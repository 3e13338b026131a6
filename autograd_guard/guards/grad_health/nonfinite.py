"""grad_health's verdict on a step whose gradients are not finite: the one place that
decides skip, run or stop for it, in every mode and for every path that finds one (a
step's own check, a closure's evaluation, the ranks of a model deciding together, a flag
read back from the device, a repaired pass that made them again). What it decides, it
says (``nonfinite_gradient``, once per call site; in strict at every stop), and after
it the localiser records the next passes; a run whose every step is non-finite is said
not to be training (``training_stalled``).
"""

from __future__ import annotations

from autograd_guard.guards.grad_health.check import all_values_finite, parameter_names
from autograd_guard.guards.grad_health.dist import local_gradient, user_names
from autograd_guard.guards.grad_health.findings import STALL_REMEDY, say_stall
from autograd_guard.guards.grad_health.gate import SKIP, drop_gradients
from autograd_guard.guards.grad_health.repair import WOULD_FIX
from autograd_guard.guards.grad_health.words import ON_DEVICE, step_outcome, stop_outcome

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn

    from autograd_guard.guards.grad_health.closure import Evaluation
    from autograd_guard.guards.grad_health.dist import Sharing
    from autograd_guard.guards.grad_health.localise import Localiser
    from autograd_guard.guards.grad_health.record import Record
    from autograd_guard.guards.grad_health.repair import Repair
    from autograd_guard.guards.grad_health.strict import StrictStop
    from autograd_guard.guards.grad_health.voice import Voice
    from autograd_guard.guards.grad_health.words import StepSites


class NonFinite:
    """``verdict``: what becomes of a non-finite step (RUN, SKIP, or a ``GuardError``
    raised in strict), said; owns which call sites have had their parameters named."""

    def __init__(
        self,
        voice: Voice,
        sites: StepSites,
        localiser: Localiser,
        strict: StrictStop,
        repair: Repair,
    ) -> None:
        self._voice, self._sites, self._localiser = voice, sites, localiser
        self._strict, self._repair = strict, repair
        self._named: set[tuple[str, str]] = set()  # (action, call site) named already

    def remedy(self) -> str:
        """What to do, pointing only at events that will come."""
        stop = self._voice.mode == "strict" and self._strict.pending is None
        return self._localiser.remedy(find_it=stop)

    def verdict(
        self,
        optimizer: Any,
        record: Record,
        bad: list[Any],
        *,
        gated: bool = True,
        on_device: bool = False,
        sharing: Sharing | None = None,
        ranks: list[int] | None = None,
        evaluation: Evaluation | None = None,
    ) -> object:
        """Report a non-finite step; the verdict (raises in strict)."""
        mode = self._voice.mode
        site = self._sites.site(optimizer)
        names = self._names("nonfinite_gradient", site, bad, sharing)
        what = f"non-finite gradient in {', '.join(names or ['some parameters'])}"
        if ranks:
            what += f" on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        speaks = sharing is None or sharing.first  # a group's decision: its first rank logs
        if mode == "strict" and not on_device:
            stop, when = (what, site, names), (gated, evaluation, sharing)
            if self._strict.defer(optimizer, record, stop, when):
                return SKIP  # that optimizer's next step raises, naming the op (see .strict)
            self._stop(optimizer, record, (what, site, names), evaluation, speaks, ranks)
        done, verdict = step_outcome(
            mode, type(optimizer).__name__, gated, evaluation, record.evaluations
        )
        if on_device:
            done = ON_DEVICE[mode]
        elif mode == "observe" and self._repair.repairs() and record.sharing is None:
            done = done.replace("fix would skip it)", f"fix would {WOULD_FIX})")
        if verdict == SKIP:
            done += _count_skip(optimizer, record, on_device, evaluation)
        if speaks:
            self._voice.emit(
                f"{what}: {done}",
                action="nonfinite_gradient",
                callsite=site,
                parameters=names,
                ranks=ranks,
                optimizer=type(optimizer).__name__,
                evaluation=record.evaluations or None,
                remedy=self.remedy(),
            )
        if bad:
            self._localiser.arm(site, self._repair.repairs(), shared=record.sharing is not None)
        if record.nonfinite(self._voice.config["stall_steps"]) and speaks:
            self._stalled(record, site)
        return verdict

    def _stop(
        self,
        optimizer: Any,
        record: Record,
        stop: tuple[str, str, Any],
        evaluation: Evaluation | None,
        speaks: bool,
        ranks: list[int] | None,
    ) -> NoReturn:
        """strict: the step does not go on; what is true of the weights, said."""
        what, site, names = stop
        kind = type(optimizer).__name__
        event = f"{what} {stop_outcome(kind, evaluation, record.evaluations, bool(ranks))}"
        self._voice.refuse(
            event,
            action="nonfinite_gradient",
            callsite=site,
            remedy=self.remedy(),
            log=speaks,  # the group's first rank logs it; every rank raises
            parameters=names,
            ranks=ranks,
        )

    def _names(
        self, action: str, site: str, params: list[Any], sharing: Sharing | None
    ) -> list[str] | None:
        """The non-finite parameters' user names: one scan of live modules per call site
        (each time in strict, which raises); a group's, from every rank of it."""
        if sharing is None and (
            not params or (self._voice.mode != "strict" and (action, site) in self._named)
        ):
            return None
        self._named.add((action, site))
        names: list[str] = []
        if params:
            grads = [p.grad for p in params]
            finite = [all_values_finite(local_gradient(g)) for g in grads]
            bad = [p for p, ok in zip(params, finite, strict=True) if not ok] or params
            grads = [p.grad for p in bad]
            names = user_names(bad, parameter_names(bad), grads)
        return sharing.gather_names(names) if sharing is not None else names

    def _stalled(self, record: Record, site: str) -> None:
        """Said when the stall starts and again each time its length doubles."""
        skipped = "each was skipped" if self._voice.mode == "fix" else "in " + self._voice.mode
        event = (
            f"{record.in_a_row} optimizer steps in a row had non-finite gradients ({skipped}; "
            f"{record.skipped} of {record.step} steps of this optimizer skipped): training "
            "is not progressing"
        )
        instead = ' (on_stall = "raise" stops the run instead)'
        say_stall(self._voice, event, site, record.in_a_row, STALL_REMEDY, instead)


def _count_skip(optimizer: Any, record: Record, on_device: bool, evaluation: Any) -> str:
    """Count a skipped step. On the ranks of a shared model whose every step so far was
    skipped (the checkpoint-resume case; not while a closure's step body is still on), its
    gradients are dropped as ``zero_grad()`` would; one process keeps a bare ``continue``.
    What the event adds to its words."""
    record.skipped += 1
    fresh = record.sharing is not None and record.skipped == record.step
    return drop_gradients(optimizer) if fresh and not on_device and evaluation is None else ""
