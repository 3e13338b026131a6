"""Guard ``grad_health``: gradients that are lost, or not finite, in any training loop.

Symptom: a parameter that requires grad silently never receives a gradient (a
``.detach()``, a ``.data`` write, a NumPy round trip, a stage run under ``no_grad``), so
it never trains; or a NaN/Inf gradient (``sqrt`` of an exact zero: a finite forward and a
NaN backward) reaches the optimizer and poisons the weights steps before anyone notices.
``torch.autograd.detect_anomaly`` finds the op but costs 2.4-2.8x per step and raises;
Lightning's and ignite's NaN terminators stop the run without saying where; AMP's
``GradScaler`` skips such steps silently.
Affected: any torch version, any optimizer (torch's global optimizer step hooks).
Upstream: pytorch/pytorch#160016 (a cheaper NaN finder).
Remedy: at each ``optimizer.step()``, one fused check (AMP's non-finite kernel with a
scale of 1.0, which leaves the values as they are, and one sync) for non-finite
gradients: ``observe`` names the parameters, ``fix`` skips that step
(weights and optimizer state untouched, as GradScaler does), ``strict`` raises before the
weights change. After the first non-finite step, the next few backward passes are
recorded (anomaly mode's forward tracebacks, with ``check_nan=False``) to name the
backward op that first produced the value and the forward line that created it. Over the
first steps, a parameter that never gets a gradient while others do is named once.
"""

from __future__ import annotations

import math
import sys

from autograd_guard._grad_probe import BackwardProbe, parameter_names
from autograd_guard._guard import Guard, GuardError, Option
from autograd_guard._wrapper import find_callsite

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any


class GradHealth(Guard):
    name = "grad_health"
    symptom = "a parameter gets no gradient, or a non-finite gradient reaches the optimizer"
    upstream = "https://github.com/pytorch/pytorch/issues/160016"
    remedy = (
        "find where the parameter leaves the graph (.detach(), .data, no_grad, numpy), or "
        "guard the op named in the event against non-finite gradients"
    )
    modules = ("torch.optim.optimizer",)
    options = {
        "lost_steps": Option(
            int,
            5,
            "steps over which a parameter that never gets a gradient is reported",
            minimum=0,
            maximum=1_000_000,
        ),
        "nonfinite": Option(bool, True, "check gradients for NaN/Inf before each step"),
        "localize_steps": Option(
            int,
            3,
            "backward passes recorded after a non-finite step to find its op",
            minimum=0,
            maximum=1000,
        ),
    }

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._handles: list[Any] = []
        self._seen: Any = None  # optimizer -> (steps, ids of parameters that had a gradient)
        self._skipped: dict[int, list[tuple[Any, Any]]] = {}  # optimizer id -> stashed grads
        self._probe: BackwardProbe | None = None
        self._localized = False
        self._flags: dict[Any, tuple[Any, Any]] = {}  # device -> (found_inf, scale 1.0)

    def _on_import(self, module: ModuleType) -> None:
        import weakref

        self._seen = weakref.WeakKeyDictionary()
        self._handles = [
            module.register_optimizer_step_pre_hook(self._before_step),
            module.register_optimizer_step_post_hook(self._after_step),
        ]

    def _on_uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._probe is not None:
            self._probe.disarm()
            self._probe = None

    # -- the hooks ---------------------------------------------------------------------

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.active:
            return None
        try:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if self.config["lost_steps"]:
                self._track_lost(optimizer, params)
            if self.config["nonfinite"]:
                self._check_finite(optimizer, params)
        except GuardError:
            raise  # strict: the step must not run
        except Exception as exc:  # fail open: the optimizer steps as it would unguarded
            self.fail("step check", exc)
        return None

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        stashed = self._skipped.pop(id(optimizer), None)
        for param, grad in stashed or ():
            param.grad = grad  # the skipped step is over: the user's gradients come back
        try:
            self._probe_step_done()
        except Exception as exc:  # fail open
            self.fail("after step", exc)

    def _probe_step_done(self) -> None:
        if self._probe is not None:
            self._probe.step_done()
            if not self._probe.armed:
                self._report_origin(self._probe)
                self._probe = None

    # -- lost gradients ----------------------------------------------------------------

    def _track_lost(self, optimizer: Any, params: list[Any]) -> None:
        steps, had_grad = self._seen.get(optimizer, (0, set()))
        if steps >= self.config["lost_steps"]:
            return
        had_grad.update(id(p) for p in params if p.grad is not None)
        steps += 1
        self._seen[optimizer] = (steps, had_grad)
        if steps < self.config["lost_steps"] or not had_grad:
            return
        lost = [p for p in params if p.requires_grad and id(p) not in had_grad]
        if lost:
            names = parameter_names(lost)
            self._emit_once(
                f"{len(lost)} parameter(s) got no gradient in the first {steps} steps while "
                f"others did: {', '.join(names)}",
                action="lost_gradient",
                parameters=names,
                shapes=[list(p.shape) for p in lost],
            )

    # -- non-finite gradients ----------------------------------------------------------

    def _check_finite(self, optimizer: Any, params: list[Any]) -> None:
        torch = sys.modules["torch"]
        with_grad = [p for p in params if p.grad is not None]
        if not with_grad:
            return
        grads = [p.grad._values() if p.grad.is_sparse else p.grad for p in with_grad]
        if self._all_finite(torch, grads):
            return
        finite = [bool(torch.isfinite(g).all()) for g in grads]  # only on a bad step
        bad = [p for p, ok in zip(with_grad, finite, strict=True) if not ok]
        names = parameter_names(bad)
        what = f"non-finite gradient in {len(bad)} parameter(s): {', '.join(names)}"
        self._arm_probe()
        if self.mode == "strict":
            self.refuse(what, action="nonfinite_gradient", callsite=_step_site(), parameters=names)
        done = "; optimizer step skipped, weights unchanged" if self.mode == "fix" else ""
        self._emit_once(what + done, action="nonfinite_gradient", parameters=names)
        if self.mode == "fix":  # the optimizer skips parameters without a gradient
            self._skipped[id(optimizer)] = [(p, p.grad) for p in with_grad]
            for p in with_grad:
                p.grad = None

    def _all_finite(self, torch: Any, grads: list[Any]) -> bool:
        """One fused check: AMP's non-finite kernel (GradScaler's), scale 1.0, one flag
        per device, then one sync. Falls back to one _foreach_norm for dtypes it lacks."""
        device = grads[0].device
        if any(g.device != device for g in grads):
            return all(
                self._all_finite(torch, [g for g in grads if g.device == d])
                for d in {g.device for g in grads}
            )
        flags = self._flags.get(device)
        if flags is None:
            flags = self._flags[device] = (
                torch.zeros(1, device=device),
                torch.ones(1, device=device),
            )
        found, one = flags
        found.zero_()
        try:
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, one)
        except RuntimeError:  # a dtype the kernel lacks
            norms = torch._foreach_norm(grads)
            return math.isfinite(torch.stack(norms).sum(dtype=torch.float64).item())
        return not found.item()  # the one device sync of a healthy step

    def _arm_probe(self) -> None:
        if self._probe is None and not self._localized and self.config["localize_steps"]:
            self._probe = BackwardProbe(self.config["localize_steps"])
            self._probe.arm()

    def _report_origin(self, probe: BackwardProbe) -> None:
        self._localized = True
        if probe.origin is None:
            return
        op, line = probe.origin
        self._emit_once(
            f"the non-finite gradient first came out of {op} in backward(), for the "
            f"forward operation at {line}",
            action="nonfinite_origin",
            op=op,
            forward=line,
        )

    def _emit_once(self, event: str, *, action: str, **fields: Any) -> None:
        self.emit(event, action=action, callsite=_step_site(), **fields)


def _step_site() -> str:
    """The user's ``optimizer.step()`` line."""
    return find_callsite("torch", "autograd_guard")


GUARD = GradHealth
