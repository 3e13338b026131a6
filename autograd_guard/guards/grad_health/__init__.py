"""Guard ``grad_health``: gradients that are lost, or not finite, in any training loop.

Symptom: a parameter that requires grad silently never receives a gradient (a
``.detach()``, a ``.data`` write, a NumPy round trip, a stage run under ``no_grad``), so
it never trains; or a NaN/Inf gradient (``sqrt`` of an exact zero: a finite forward and a
NaN backward) reaches the optimizer and poisons the weights steps before anyone notices.
``torch.autograd.detect_anomaly`` finds the op but costs 2.4-2.8x per step and raises;
Lightning's and ignite's NaN terminators stop the run without saying where; AMP's
``GradScaler`` skips such steps silently.
Affected: any torch version, any optimizer that torch wraps with its step hooks. Where
the check itself must take care: torch 2.1 has no CPU kernel for AMP's non-finite check,
and its first ``torch.compile`` strips the wrapper that calls the step hooks from
``torch.optim``'s classes; under the ``.pth`` the hooks are registered while ``import
torch`` runs, before Dynamo can be told to leave them alone (every version).
Upstream: pytorch/pytorch#160016 (a cheaper NaN finder).
Remedy: at each ``optimizer.step()``, in a gate between torch's step hooks and the step body
(after the user's pre-hooks, so a hook that cleans gradients is respected), one fused check
of the gradients the step consumes: ``observe`` names the parameters; ``fix`` skips the step
for real, its body never runs (weights, state, ``param_groups`` and inner optimizers as
after a hand-written ``continue``; the post-hooks still run, as the lines after ``step()``
do); ``strict`` raises before the weights change. A closure step is checked after each
evaluation and stopped there, undone from a snapshot where it may have moved the weights
(LBFGS, SAM). The ranks of one model (DDP, ZeRO, FSDP, tensor parallel, pipeline stages)
decide each step together, on a channel of the guard's own that never meets the user's
collectives (or alone, said once, where they are out of step). A fused optimizer on CUDA is
lent the flag and skips on the device, with no host sync; steps that GradScaler hands to a
fused optimizer are its to skip. After the first non-finite step, a few backward passes are
recorded to name the backward op that first produced the value and the forward line that ran
it (or the forward op that made a value the forward pass already held). Where that same op
makes them again (a singular point where the parameters sit: a norm at 0, a fully masked
softmax row, ``log(0)``), fix repairs the gradient there: the op's non-finite outputs become
0 and the step runs (``nonfinite_fix``; ``repair``). A parameter that gets no gradient over
the first ``lost_steps`` steps while others do is named once: a finding where its module ran
in the forward pass, a note where it never did (``usage``); an optimizer that sees no
gradient at all for ``lost_steps`` steps in a row is a finding; so is a run whose every step
is non-finite for ``stall_steps`` steps, and one whose every gradient is exactly zero
(finite, present, and 0.0: a detached loss term, a hard silhouette, a mask of zeros, dead
ReLUs) for ``zero_steps`` steps (``zero``); so is one parameter whose gradient is exactly
zero at each of an optimizer's first ``zero_steps`` steps while others' are not (a stale
adjoint in a Warp kernel: ``zero_params``)."""

from __future__ import annotations

import threading

from autograd_guard._events import events as _events
from autograd_guard.guard import Guard, Option
from autograd_guard.guards.grad_health.check import FiniteCheck, all_values_finite, parameter_names
from autograd_guard.guards.grad_health.compile import EagerHooks
from autograd_guard.guards.grad_health.dist import local_gradient, user_names
from autograd_guard.guards.grad_health.findings import FIND_IT, MAKE_SAFE, Findings
from autograd_guard.guards.grad_health.flow import StepFlow
from autograd_guard.guards.grad_health.gate import SKIP, Gates, drop_gradients
from autograd_guard.guards.grad_health.loss import LossCheck
from autograd_guard.guards.grad_health.probe import BackwardProbe
from autograd_guard.guards.grad_health.record import Records
from autograd_guard.guards.grad_health.repair import WOULD_FIX, RepairFlow
from autograd_guard.guards.grad_health.strict import StrictStop
from autograd_guard.guards.grad_health.words import ON_DEVICE, StepSites, step_outcome, stop_outcome

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, NoReturn

    from autograd_guard.guard import Target
    from autograd_guard.guards.grad_health.closure import Evaluation
    from autograd_guard.guards.grad_health.dist import Sharing
    from autograd_guard.guards.grad_health.mending import Repairer
    from autograd_guard.guards.grad_health.record import Record


class GradHealth(StepFlow, RepairFlow, StrictStop, LossCheck, Findings, Guard):
    name = "grad_health"
    symptom = "a parameter gets no gradient, or a non-finite gradient reaches the optimizer"
    upstream = "https://github.com/pytorch/pytorch/issues/160016"
    remedy = f"find the op that made the value: {FIND_IT}; then {MAKE_SAFE}"
    modules = ("torch.optim.optimizer",)
    options = {
        "lost_steps": Option(
            int,
            100,
            "optimizer steps after which a parameter that never got a gradient, while "
            "others did, is named (a finding where its module ran in the forward pass, a "
            "note where it never did), and after which an optimizer none of whose "
            "parameters had a gradient for that many steps in a row is (0: off)",
            minimum=0,
            maximum=1_000_000,
        ),
        "nonfinite": Option(bool, True, "check gradients for NaN/Inf before each step"),
        "localize_steps": Option(
            int,
            3,
            "backward passes recorded after a non-finite step to find its op (0: off)",
            minimum=0,
            maximum=1000,
        ),
        "nonfinite_fix": Option(
            str,
            "repair",
            "what fix does when the same backward op makes non-finite gradients step after "
            "step (a singular point where the parameters sit): set its non-finite outputs "
            "to 0 and run the step (repair), or skip every such step (skip); a one-off "
            "non-finite step, or one whose loss is non-finite too, is always skipped (a "
            "non-finite loss with finite gradients is said, and its step runs)",
            choices=("repair", "skip"),
        ),
        "stall_steps": Option(
            int,
            20,
            "non-finite steps in a row after which the run is said, as an error, not to be "
            "training (again each time the stall's length doubles; 0: off)",
            minimum=0,
            maximum=1_000_000,
        ),
        "on_stall": Option(
            str,
            "warn",
            "what a stall does: log an error (warn) or stop the run with a GuardError (raise)",
            choices=("warn", "raise"),
        ),
        "exchange_timeout": Option(
            float,
            60.0,
            "seconds a rank waits for the others' word at a shared optimizer step before it "
            "decides alone from then on (ranks out of step, a rank gone)",
            minimum=1.0,
            maximum=86_400.0,
        ),
        "zero_steps": Option(
            int,
            20,
            "optimizer steps in a row whose every gradient is exactly zero (none missing, "
            "none non-finite) after which the run is said to learn nothing (a warning, once "
            "per streak; checked with nonfinite; 0: off)",
            minimum=0,
            maximum=1_000_000,
        ),
    }

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._records = Records()
        self._finite = FiniteCheck()
        self._hooks = EagerHooks()
        self._gates = Gates(self._decide, self._finish, self._closure_step)
        self._sites = StepSites(self._gates.step_codes)
        self._stepping = threading.local()
        self._probe: BackwardProbe | None = None
        self._probe_site: str | None = None
        self._probes_left = 3  # a probe may find nothing (another thread's passes)
        self._named: set[tuple[str, str]] = set()  # (action, call site) named already
        self._probe_lock = threading.Lock()
        self._repairer: Repairer | None = None
        self._repair_stopped = False  # a repair stalled: such steps are skipped again

    def steps_watched(self) -> int:
        """Optimizer steps seen so far, of every optimizer."""
        return self._records.steps

    def _attach(self, module: ModuleType, target: Target | None) -> None:
        from autograd_guard._common import importer as _importer

        self._hooks.prepare(module, self._before_step, self._after_step)
        _importer.when_imported("torch._dynamo", self._dynamo_imported)  # 2.1: rehooked first
        try:
            self._gates.watch(module.Optimizer, self._hooks.register)
        except Exception as exc:  # fail open: every step is seen from the step hooks
            self._hooks.register()
            self.fail("hook", exc)
        self._watch_loss()
        _events.at_exit(self._exit_check)

    def _dynamo_imported(self, dynamo: ModuleType) -> None:
        try:
            self._gates.eager(dynamo)
            self._hooks.dynamo_imported(dynamo, self._run_unhooked_step)
        except Exception as exc:  # fail open: the hooks run as they are
            self.fail("hook", exc)

    def _exit_check(self) -> None:
        if self.active:
            self._at_exit()

    def _detach(self) -> None:
        self._unwatch_loss()
        self._hooks.remove()
        self._gates.remove()
        with self._probe_lock:
            if self._probe is not None:
                self._probe.disarm()
                self._probe = None
        if self._repairer is not None:
            self._repairer.disarm()

    def _nonfinite(
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
        site = self._sites.site(optimizer)
        names = self._names("nonfinite_gradient", site, bad, sharing)
        what = f"non-finite gradient in {', '.join(names or ['some parameters'])}"
        if ranks:
            what += f" on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        speaks = sharing is None or sharing.first  # a group's decision: its first rank logs
        if self.mode == "strict" and not on_device:
            stop, when = (what, site, names), (gated, evaluation, sharing)
            if self._defer_stop(optimizer, record, stop, when):
                return SKIP  # the next step raises, naming the op (see .strict)
            self._stop(optimizer, record, what, site, names, evaluation, speaks, ranks)
        done, verdict = step_outcome(
            self.mode, type(optimizer).__name__, gated, evaluation, record.evaluations
        )
        if on_device:
            done = ON_DEVICE[self.mode]
        elif self.mode == "observe" and self._repairs():
            done = done.replace("fix would skip it)", f"fix would {WOULD_FIX})")
        if verdict == SKIP:
            done += _count_skip(optimizer, record, on_device, evaluation)
        if speaks:
            self.emit(
                f"{what}: {done}",
                action="nonfinite_gradient",
                callsite=site,
                parameters=names,
                ranks=ranks,
                optimizer=type(optimizer).__name__,
                evaluation=record.evaluations or None,
                remedy=self._nonfinite_remedy(),
            )
        if bad:
            self._arm_probe(site, shared=record.sharing is not None)
        if record.nonfinite(self.config["stall_steps"]) and speaks:
            self._stalled(record, site)
        return verdict

    def _stop(
        self,
        optimizer: Any,
        record: Record,
        what: str,
        site: str,
        names: Any,
        evaluation: Evaluation | None,
        speaks: bool,
        ranks: list[int] | None,
    ) -> NoReturn:
        """strict: the step does not go on; what is true of the weights, said."""
        kind = type(optimizer).__name__
        event = f"{what} {stop_outcome(kind, evaluation, record.evaluations, bool(ranks))}"
        self.refuse(
            event,
            action="nonfinite_gradient",
            callsite=site,
            remedy=self._nonfinite_remedy(),
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
            not params or (self.mode != "strict" and (action, site) in self._named)
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


GUARD = GradHealth


def _count_skip(optimizer: Any, record: Record, on_device: bool, evaluation: Any) -> str:
    """Count a skipped step. On the ranks of a shared model whose every step so far was
    skipped (the checkpoint-resume case; not while a closure's step body is still on), its
    gradients are dropped as ``zero_grad()`` would; one process keeps a bare ``continue``.
    What the event adds to its words."""
    record.skipped += 1
    fresh = record.sharing is not None and record.skipped == record.step
    return drop_gradients(optimizer) if fresh and not on_device and evaluation is None else ""
