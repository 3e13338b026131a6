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
Remedy: at each ``optimizer.step()`` (after its closure, if it has one), one fused check
(AMP's non-finite kernel with a scale of 1.0, which leaves the values as they are, and
one sync) for non-finite gradients: ``observe`` names the parameters, ``fix`` skips that
step (weights and optimizer state untouched, as GradScaler does), ``strict`` raises before
the weights change. Steps that GradScaler hands to a fused optimizer are GradScaler's to
skip. After the first non-finite step, the next few backward passes are recorded (anomaly
mode's forward tracebacks, with ``check_nan=False``) to name the backward op that first
produced the value and the forward line that created it. Over the first steps, a
parameter that never gets a gradient while others do is named once.
"""

from __future__ import annotations

import sys

from autograd_guard._grad_probe import BackwardProbe, all_finite, parameter_names
from autograd_guard._guard import Guard, GuardError, Option
from autograd_guard._wrapper import argument, find_callsite

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
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
        self._described: set[tuple[str, str]] = set()  # (action, call site) named already
        self._probe: BackwardProbe | None = None
        self._localized = False
        self._flags: dict[Any, tuple[Any, Any]] = {}  # device -> (found_inf, scale 1.0)
        self._check_eager: Callable[..., None] = self._check

    def _on_import(self, module: ModuleType) -> None:
        import weakref

        self._seen = weakref.WeakKeyDictionary()
        # Under torch.compile the hooks run eagerly at a graph break: traced, the check's
        # sync would fail and the step would go unchecked.
        eager = getattr(getattr(sys.modules["torch"], "compiler", None), "disable", None)
        eager = eager or (lambda fn: fn)
        self._check_eager = eager(self._check)
        self._handles = [
            module.register_optimizer_step_pre_hook(eager(self._before_step)),
            module.register_optimizer_step_post_hook(eager(self._after_step)),
        ]

    def _on_uninstall(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._probe is not None:
            self._probe.disarm()
            self._probe = None

    # -- the hooks ---------------------------------------------------------------------

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        if not self.active:
            return None
        if self._skipped:
            self._skipped.pop(id(optimizer), None)  # left by a step that raised
        closure = argument(args, kwargs, "closure", 1) if len(args) > 1 or kwargs else None
        if closure is None:
            self._check(optimizer, kwargs, first=True)
            return None
        # The gradients exist only once the closure has run inside step(): check then.
        checked = self._after_closure(optimizer, closure, kwargs)
        if len(args) > 1:
            return (args[0], checked, *args[2:]), kwargs
        return args, {**kwargs, "closure": checked}

    def _after_closure(self, optimizer: Any, closure: Any, kwargs: Any) -> Callable[[], Any]:
        calls = [0]

        def closure_then_check() -> Any:
            loss = closure()
            calls[0] += 1
            if self.active:
                self._check_eager(optimizer, kwargs, first=calls[0] == 1)
            return loss

        return closure_then_check

    def _check(self, optimizer: Any, kwargs: Any, first: bool) -> None:
        try:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if first and self.config["lost_steps"]:
                self._track_lost(optimizer, params)
            if self.config["nonfinite"] and not _scaler_decides(optimizer, kwargs):
                self._check_finite(optimizer, params)
        except GuardError:
            raise  # strict: the step must not run
        except Exception as exc:  # fail open: the optimizer steps as it would unguarded
            self.fail("step check", exc)

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._skipped:
            for param, grad in self._skipped.pop(id(optimizer), ()):
                param.grad = grad  # the skipped step is over: the user's gradients come back
        if self._probe is not None:
            try:
                self._probe_step_done(self._probe)
            except Exception as exc:  # fail open
                self.fail("after step", exc)

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
            self.emit(
                f"{len(lost)} parameter(s) got no gradient in the first {steps} steps while "
                f"others did: {', '.join(names)}",
                action="lost_gradient",
                callsite=_step_site(),
                parameters=names,
                shapes=[list(p.shape) for p in lost],
            )

    # -- non-finite gradients ----------------------------------------------------------

    def _check_finite(self, optimizer: Any, params: list[Any]) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        if not grads or all_finite(grads, self._flags):
            return
        with_grad = [p for p in params if p.grad is not None]
        self._arm_probe()
        action, site = "nonfinite_gradient", _step_site()
        names = None  # named (one scan of live modules) once per call site, or in strict
        if self.mode == "strict" or (action, site) not in self._described:
            self._described.add((action, site))
            names = parameter_names([p for p in with_grad if not all_finite([p.grad])])
        what = f"non-finite gradient in {', '.join(names or ['some parameters'])}"
        if self.mode == "strict":
            self.refuse(what, action=action, callsite=site, parameters=names)
        done = "; optimizer step skipped, weights unchanged" if self.mode == "fix" else ""
        self.emit(what + done, action=action, callsite=site, parameters=names)
        if self.mode == "fix":  # the optimizer skips parameters without a gradient
            self._skipped[id(optimizer)] = [(p, p.grad) for p in with_grad]
            for p in with_grad:
                p.grad = None

    # -- where it came from ------------------------------------------------------------

    def _arm_probe(self) -> None:
        if self._probe is None and not self._localized and self.config["localize_steps"]:
            self._probe = BackwardProbe(self.config["localize_steps"])
            self._probe.arm()

    def _probe_step_done(self, probe: BackwardProbe) -> None:
        if not probe.step_done():
            return
        self._probe, self._localized = None, True
        if probe.error is not None:
            self.fail("localise", probe.error)
        elif probe.origin is not None:
            op, line = probe.origin
            self.emit(
                f"the non-finite gradient first came out of {op} in backward(), for the "
                f"forward operation at {line}",
                action="nonfinite_origin",
                callsite=_step_site(),
                op=op,
                forward=line,
            )


def _scaler_decides(optimizer: Any, kwargs: Any) -> bool:
    """GradScaler handed this step to an optimizer that unscales and skips inf steps itself
    (fused Adam/AdamW/SGD): the gradients are still scaled, and an inf is expected."""
    return "grad_scaler" in kwargs or getattr(optimizer, "found_inf", None) is not None


def _step_site() -> str:
    """The user's ``optimizer.step()`` line."""
    return find_callsite("torch", "autograd_guard")


GUARD = GradHealth
