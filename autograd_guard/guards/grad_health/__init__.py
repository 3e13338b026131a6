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
collectives (or alone, said once, where they are out of step); plain DDP, whose gradients
are the same on every rank, needs no exchange (``replicas``). A fused optimizer on CUDA is
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

from autograd_guard._events import events as _events
from autograd_guard.guard import Guard, Option
from autograd_guard.guards.grad_health.check import FiniteCheck
from autograd_guard.guards.grad_health.compile import EagerHooks
from autograd_guard.guards.grad_health.findings import FIND_IT, MAKE_SAFE
from autograd_guard.guards.grad_health.flow import Parts, StepFlow
from autograd_guard.guards.grad_health.gate import step_codes
from autograd_guard.guards.grad_health.localise import Localiser
from autograd_guard.guards.grad_health.loss import LossCheck
from autograd_guard.guards.grad_health.nonfinite import NonFinite
from autograd_guard.guards.grad_health.repair import Repair
from autograd_guard.guards.grad_health.strict import StrictStop
from autograd_guard.guards.grad_health.together import Together
from autograd_guard.guards.grad_health.usage import Usage
from autograd_guard.guards.grad_health.voice import Voice
from autograd_guard.guards.grad_health.words import StepSites
from autograd_guard.guards.grad_health.zero import ZeroWatch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

    from autograd_guard.guard import Target
    from autograd_guard.guards.grad_health.record import Records


class GradHealth(Guard):
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
            "decides alone from then on (a rank gone, a step repeated, or one left where no "
            "forward of the model tells it); at most half the shortest timeout of the "
            "process groups the model uses",
            minimum=1.0,
            maximum=86_400.0,
        ),
        "exchange_ddp": Option(
            bool,
            False,
            "exchange at a plain DDP model's steps too; by default each rank of it decides "
            "on its own gradients, which DDP's all-reduce made the same on every rank (as "
            "torch's GradScaler does), with nothing exchanged: set it where your code "
            "changes a gradient on one rank after DDP's all-reduce",
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
        voice = Voice(self.emit, self.refuse, self.fail, self.mode, self.config)
        hooks = self._hooks = EagerHooks()
        sites = StepSites(step_codes)
        localiser = self._localiser = Localiser(voice, hooks, sites)
        strict = self._strict = StrictStop(voice, localiser)
        repair = self._repair = Repair(voice, hooks, sites, localiser)
        self._loss = LossCheck(voice, hooks, localiser)
        usage = self._usage = Usage(voice, hooks, sites)
        zero = ZeroWatch(voice, sites)
        nonfinite = NonFinite(voice, sites, localiser, strict, repair)
        finite = FiniteCheck()
        together = Together(voice, sites, finite, zero, nonfinite, hooks)
        parts = Parts(finite, usage, together, repair, zero, nonfinite, strict, localiser)
        self._flow = StepFlow(voice, hooks, sites, parts)

    @property
    def _records(self) -> Records:
        """Every optimizer's record (the step pipeline's)."""
        return self._flow.records

    def steps_watched(self) -> int:
        """Optimizer steps seen so far, of every optimizer."""
        return self._flow.records.steps

    def _attach(self, module: ModuleType, target: Target | None) -> None:
        from autograd_guard._common import importer as _importer

        flow = self._flow
        self._hooks.prepare(module, flow.before_step, flow.after_step)
        _importer.when_imported("torch._dynamo", self._dynamo_imported)  # 2.1: rehooked first
        try:
            flow.gates.watch(module.Optimizer, self._hooks.register)
        except Exception as exc:  # fail open: every step is seen from the step hooks
            self._hooks.register()
            self.fail("hook", exc)
        self._loss.watch()
        _events.at_exit(self._exit_check)

    def _dynamo_imported(self, dynamo: ModuleType) -> None:
        try:
            self._flow.gates.eager(dynamo)
            self._hooks.dynamo_imported(dynamo, self._flow.run_unhooked_step)
        except Exception as exc:  # fail open: the hooks run as they are
            self.fail("hook", exc)

    def _exit_check(self) -> None:
        if self.active:
            self._at_exit()

    def _detach(self) -> None:
        self._flow.stop()
        self._loss.unwatch()
        self._hooks.remove()
        self._flow.gates.remove()
        self._localiser.detach()
        self._repair.detach()

    def settle(self) -> None:
        """The end of one run inside the process (a test of a guarded pytest session):
        what the exit would say of the optimizers seen so far is said now, and they are
        forgotten (each test is a run of its own; an optimizer that lives on starts anew)."""
        self._at_exit()
        self._flow.restart()
        self._repair.forget()

    def _at_exit(self) -> None:
        """The run is over: an armed localiser's last word, and parameters (or whole
        optimizers) that got no gradient in a run shorter than ``lost_steps``."""
        self._strict.exit()  # strict: a deferred stop no step raised
        self._localiser.stop(at_exit=True)
        self._loss.finished("the run ended before another forward pass")
        self._repair.exit()
        records = self._flow.records
        for record in records.all():
            self._usage.at_exit(record)
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
        records.over = True  # what is freed from now on says nothing (shutdown)


GUARD = GradHealth
