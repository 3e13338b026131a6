"""Guard ``grad_health``: gradients that are lost, or not finite, in any training loop.

Symptom: a parameter that requires grad silently never receives a gradient (a
``.detach()``, a ``.data`` write, a NumPy round trip, a stage run under ``no_grad``), so
it never trains; or a NaN/Inf gradient (``sqrt`` of an exact zero: a finite forward and a
NaN backward) reaches the optimizer and poisons the weights steps before anyone notices.
``torch.autograd.detect_anomaly`` finds the op but costs 2.4-2.8x per step and raises;
Lightning's and ignite's NaN terminators stop the run without saying where; AMP's
``GradScaler`` skips such steps silently.
Affected: any torch version, any optimizer (torch's global optimizer step hooks). Where
the check itself must take care: torch 2.1 has no CPU kernel for AMP's non-finite check,
and its first ``torch.compile`` strips the wrapper that calls the step hooks from
``torch.optim``'s classes; under the ``.pth`` the hooks are registered while ``import
torch`` runs, before Dynamo can be told to leave them alone (every version).
Upstream: pytorch/pytorch#160016 (a cheaper NaN finder).
Remedy: at each ``optimizer.step()`` (after each evaluation of its closure, if it has one),
one fused check for non-finite gradients: ``observe`` names the parameters, ``fix`` skips
that step with weights and optimizer state untouched (a fused optimizer on CUDA is handed
the flag and skips on the device, with no host sync; a closure evaluated several times is
undone from a snapshot), ``strict`` raises before the weights change. The user's step hooks
see the gradients either way. Steps that GradScaler hands to a fused optimizer are its to
skip. After the first non-finite step, a few backward passes are recorded to name the
backward op that first produced the value and the forward line that ran it. A parameter
that gets no gradient over the first ``lost_steps`` steps while others do is a finding,
named once; so is a run whose every step is non-finite for ``stall_steps`` steps.
"""

from __future__ import annotations

import threading

from autograd_guard._grad_check import FiniteCheck, all_values_finite, parameter_names
from autograd_guard._grad_compile import EagerHooks
from autograd_guard._grad_flow import StepFlow
from autograd_guard._grad_probe import BackwardProbe
from autograd_guard._grad_record import Record, Records
from autograd_guard.guard import Guard, Option, find_callsite

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, NoReturn

    from autograd_guard.guard import Target

NONFINITE_REMEDY = (
    "make the op named by the nonfinite_origin event safe for gradients (sqrt(x + eps), "
    "clamp its input, torch.where on a safe input) or lower the learning rate"
)
LOST_REMEDY = (
    "find where the parameter leaves the autograd graph (.detach(), .data, torch.no_grad, "
    "a NumPy round trip), or set requires_grad=False if it is meant to stay frozen"
)
ORIGIN_REMEDY = (
    "make that forward operation safe for gradients: add an epsilon (sqrt(x + eps)), "
    "clamp its input, or compute it with torch.where on a safe input"
)
STALL_REMEDY = (
    "stop the run and fix the op named by nonfinite_origin, or resume from a checkpoint: "
    "a step with non-finite gradients does not train"
)


class GradHealth(StepFlow, Guard):
    name = "grad_health"
    symptom = "a parameter gets no gradient, or a non-finite gradient reaches the optimizer"
    upstream = "https://github.com/pytorch/pytorch/issues/160016"
    remedy = NONFINITE_REMEDY
    modules = ("torch.optim.optimizer",)
    options = {
        "lost_steps": Option(
            int,
            100,
            "optimizer steps after which a parameter that never got a gradient, while "
            "others did, is named (0: off)",
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
        "stall_steps": Option(
            int,
            20,
            "non-finite steps in a row after which the run is said, once and as an error, "
            "not to be training (0: off)",
            minimum=0,
            maximum=1_000_000,
        ),
    }

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._records = Records()
        self._finite = FiniteCheck()
        self._hooks = EagerHooks()
        self._probe: BackwardProbe | None = None
        self._probes_left = 3  # a probe may find nothing (another thread's passes)
        self._named: set[tuple[str, str]] = set()  # (action, call site) named already
        self._probe_lock = threading.Lock()

    def _attach(self, module: ModuleType, target: Target | None) -> None:
        from autograd_guard import _importer

        self._hooks.register(module, self._before_step, self._after_step)
        _importer.when_imported("torch._dynamo", self._dynamo_imported)

    def _dynamo_imported(self, dynamo: ModuleType) -> None:
        try:
            self._hooks.dynamo_imported(dynamo, self._run_unhooked_step)
        except Exception as exc:  # fail open: the hooks run as they are
            self.fail("hook", exc)

    def _detach(self) -> None:
        self._hooks.remove()
        for record in self._records.all():
            if record.window is not None:
                record.window.restore()
                record.window.detach()
        with self._probe_lock:
            if self._probe is not None:
                self._probe.disarm()
                self._probe = None

    def _nonfinite(
        self, optimizer: Any, record: Record, with_grad: list[Any], on_device: bool = False
    ) -> None:
        site = _step_site()
        names = self._names("nonfinite_gradient", site, with_grad)
        what = f"non-finite gradient in {', '.join(names or ['some parameters'])}"
        done = self._skip(optimizer, record, with_grad, on_device, what, site, names)
        self.emit(
            f"{what}: {done}",
            action="nonfinite_gradient",
            callsite=site,
            parameters=names,
            optimizer=type(optimizer).__name__,
            evaluation=record.evaluations or None,
        )
        self._arm_probe()
        if record.nonfinite(self.config["stall_steps"]):
            self.emit(
                f"{record.in_a_row} optimizer steps in a row had non-finite gradients "
                f"({'each was skipped' if self.mode == 'fix' else 'in ' + self.mode}): "
                "training is not progressing",
                action="training_stalled",
                callsite=site,
                level="error",
                remedy=STALL_REMEDY,
                steps=record.in_a_row,
            )

    def _refuse(self, what: str, site: str, names: Any, moved: bool) -> NoReturn:
        note = "; the weights had already been updated by its earlier evaluations" if moved else ""
        event = f"{what} was stopped before the weights changed{note}"
        hint = " (observe or fix also name the backward op and the forward line)"
        self.refuse(
            event,
            action="nonfinite_gradient",
            callsite=site,
            remedy=NONFINITE_REMEDY + hint,
            parameters=names,
        )

    def _names(self, action: str, site: str, params: list[Any]) -> list[str] | None:
        """The non-finite parameters' names: one scan of live modules per call site (each
        time in strict, which raises)."""
        if not params or (self.mode != "strict" and (action, site) in self._named):
            return None
        self._named.add((action, site))
        bad = [p for p in params if not all_values_finite(p.grad)]
        return parameter_names(bad or params)

    # -- findings ----------------------------------------------------------------------

    def _report_lost(self, lost: list[Any]) -> None:
        names = parameter_names(lost)
        steps = self.config["lost_steps"]
        self.emit(
            f"{len(lost)} parameter(s) got no gradient in {steps} optimizer steps while the "
            f"others did: {', '.join(names)}",
            action="lost_gradient",
            callsite=_step_site(),
            remedy=LOST_REMEDY,
            parameters=names,
            shapes=[list(p.shape) for p in lost],
        )

    def _arm_probe(self) -> None:
        passes = self.config["localize_steps"]
        with self._probe_lock:
            if self._probe is None and self._probes_left > 0 and passes:
                self._probes_left -= 1
                probe = BackwardProbe(passes, passes + 2, self._hooks.eager)
                probe.arm()
                self._probe = probe

    def _probe_finished(self, probe: BackwardProbe) -> None:
        with self._probe_lock:
            if self._probe is not probe:
                return
            self._probe = None
            if probe.origin is not None:
                self._probes_left = 0
        if probe.error is not None:
            self.fail("localise", probe.error)
        elif probe.origin is not None:
            op, line = probe.origin
            self.emit(
                f"the first non-finite gradient came out of {op}, the backward of the "
                f"forward operation on line {line}; seen by the optimizer step",
                action="nonfinite_origin",
                callsite=_step_site(),
                remedy=ORIGIN_REMEDY,
                op=op,
                forward=line,
            )


def _step_site() -> str:
    """The user's ``optimizer.step()`` line."""
    return find_callsite("torch", "autograd_guard")


GUARD = GradHealth
