"""grad_health's repair at the origin: a singular point where the parameters sit.

Symptom: a gradient that is non-finite at one point of an op that the run keeps meeting
(the norm of a rotation vector at exactly 0, a rotation fit that starts at the identity;
softmax over an attention row that the masks together mask fully; ``log`` of an exact 0
in a soft distance transform). Skipping is right for a one-off bad batch, but here every
step is non-finite: fix skips them all, ``training_stalled`` fires, the run ends untrained.
Users' own fixes (``torch.where`` on a safe input, ``clamp``, ``+ eps``, a Taylor branch)
all give that point a finite gradient, usually the limit, and for a masked row exactly 0.
Remedy (fix, ``nonfinite_fix = "repair"``): once the localiser has traced the non-finite
values to the same backward node in two passes in a row (three non-finite steps in a
row: a one-off batch stays a plain skip), every later backward pass has that node's
non-finite outputs set to 0, and the step runs. Only while the loss is finite: a
non-finite loss (or a non-finite forward value the loss uses) is a divergence, never
repaired; those steps stay skipped. The mending is a few kernels per hooked node, on the
device, with no host read: whether a pass changed a value, and its loss, are read once
they are ready (``PendingFlag``), never by waiting. A repair that has run ``stall_steps``
steps without the loss falling has stalled: it is said as ``training_stalled``, and it
stops (later such steps are skipped again). A repair that has changed nothing for 20
passes in a row stands down (the run has left the singular point; should it come back,
it is found and confirmed again). observe says what fix would do.
"""

from __future__ import annotations

import collections
import functools
import sys
import threading

from autograd_guard.guards.grad_health.check import PendingFlag, gradient_sum
from autograd_guard.guards.grad_health.gate import RUN
from autograd_guard.guards.grad_health.made import mend_node, node_key
from autograd_guard.guards.grad_health.probe import _graph, _in_transform

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NoReturn

    from autograd_guard._common.environment import Mode
    from autograd_guard.guards.grad_health.compile import EagerHooks
    from autograd_guard.guards.grad_health.probe import BackwardProbe
    from autograd_guard.guards.grad_health.record import Record
    from autograd_guard.guards.grad_health.words import StepSites

FALL = 1e-3  # the least relative fall of the loss that counts as training
REST = 20  # passes in a row that changed nothing, after which the repair stands down


class _Pass:
    __slots__ = ("flags", "gate")

    def __init__(self, gate: Any) -> None:
        self.gate = gate  # the loss is finite (a flag on its device)
        self.flags: list[Any] = []  # per mended output: a value was changed


class Repairer:
    """Mends, in every backward pass, the non-finite outputs of the nodes it knows."""

    def __init__(self, eager: Callable[[Any], Any]) -> None:
        self.keys: set[tuple[Any, ...]] = set()
        self.pending: collections.deque[PendingFlag] = collections.deque()
        self.passes = self.repaired = 0  # backward passes seen, and those mended
        self.quiet = 0  # passes in a row that changed nothing
        self.first: float | None = None  # the loss of the first mended pass
        self.best: float | None = None
        self.judged = False  # the stall check has been made
        self.site = "-"  # the step where repair began
        self.armed = False
        self._eager = eager
        self._originals: dict[str, Any] = {}
        self._patched: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._hook = eager(self._mend)

    def arm(self) -> None:
        torch = sys.modules["torch"]
        with self._lock:
            if self.armed:
                return
            for name in ("backward", "grad"):
                self._originals[name] = getattr(torch.autograd, name)
                self._patched[name] = self._eager(self._repairing(name))
                setattr(torch.autograd, name, self._patched[name])
            self.armed = True

    def disarm(self) -> None:
        with self._lock:
            if not self.armed:
                return
            self.armed = False
            torch = sys.modules["torch"]
            for name, original in self._originals.items():
                if getattr(torch.autograd, name) is self._patched[name]:
                    setattr(torch.autograd, name, original)

    def _repairing(self, name: str) -> Callable[..., Any]:
        keyword = "tensors" if name == "backward" else "outputs"

        def repairing(*args: Any, **kwargs: Any) -> Any:
            original = self._originals[name]
            if not self.armed or _in_transform():
                return original(*args, **kwargs)
            roots = args[0] if args else kwargs.get(keyword)
            handles, state, loss = self._hook_graph(roots)
            try:
                return original(*args, **kwargs)
            finally:
                self._pass_done(handles, state, loss)

        return repairing

    def _hook_graph(self, tensors: Any) -> tuple[list[Any], _Pass | None, Any]:
        torch = sys.modules["torch"]
        roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
        with torch.no_grad():
            sums = [gradient_sum(torch, t).float() for t in roots if t.is_floating_point()]
            loss = torch.stack(sums).sum() if sums else None
        if loss is None:
            return [], None, None
        state = _Pass(loss.isfinite())
        handles = [
            node.register_hook(functools.partial(self._hook, node, state))
            for node in _graph([t.grad_fn for t in roots if t.grad_fn is not None])
            if node_key(node) in self.keys
        ]
        return handles, state, loss

    def _mend(self, node: Any, state: _Pass, grad_inputs: Any, grad_outputs: Any) -> Any:
        torch = sys.modules["torch"]
        with torch.no_grad():
            out, flags = mend_node(torch, node, grad_inputs, grad_outputs, state.gate)
        state.flags += flags
        return out

    def _pass_done(self, handles: list[Any], state: _Pass | None, loss: Any) -> None:
        for handle in handles:
            handle.remove()
        if state is None or not handles:
            return
        torch = sys.modules["torch"]
        with torch.no_grad():
            changed = torch.stack(state.flags).any() if state.flags else loss.isnan()
            # the loss where a value was changed, NaN where none was: one value to read
            value = torch.where(changed, loss, torch.full_like(loss, float("nan")))
        self.pending.append(PendingFlag(value))

    def drain(self) -> None:
        """Read the passes whose flags are ready (never waiting for one)."""
        while self.pending and self.pending[0].ready():
            value = float(self.pending.popleft().host[0].item())
            self.passes += 1
            self.quiet = self.quiet + 1 if value != value else 0
            if value == value:  # not NaN: this pass was mended
                self.repaired += 1
                self.first = value if self.first is None else self.first
                self.best = value if self.best is None else min(self.best, value)

    def stalled(self, steps: int) -> bool:
        """Judged once, after ``steps`` mended passes: the loss fell by less than 0.1%."""
        if self.judged or not steps or self.repaired < steps:
            return False
        self.judged = True
        first, best = self.first or 0.0, self.best or 0.0
        return not best < first - FALL * abs(first)


REPAIRED = (
    "from step {step} on, the non-finite gradient that {op} (the backward of the forward "
    "operation on line {line}) made in {passes} backward passes in a row is repaired at "
    "that op: its non-finite outputs are set to 0 (the limit torch.where or clamp on a "
    "safe input would give) and the step runs. The gradient was changed: it is not the "
    "derivative at that point"
)
WOULD = (
    "{op} (the backward of the forward operation on line {line}) made non-finite gradients "
    "in {passes} backward passes in a row: fix would set its non-finite outputs to 0 there "
    "and run the step (observe changes nothing)"
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


class RepairFlow:
    """The repair half of ``GradHealth``: when to begin, what is said, when to stop."""

    mode: Mode
    config: dict[str, Any]
    _probe: BackwardProbe | None
    _hooks: EagerHooks
    _sites: StepSites
    _repairer: Repairer | None
    _repair_stopped: bool
    emit: Callable[..., bool]
    refuse: Callable[..., NoReturn]
    _nonfinite: Callable[..., object]

    def _repairs(self) -> bool:
        return self.config["nonfinite_fix"] == "repair" and not self._repair_stopped

    def _mended_verdict(self, optimizer: Any, record: Record, gated: bool) -> object | None:
        """The step after a probe pass that mended its gradients: repaired (the same node
        made them again), or skipped as the non-finite step it was."""
        probe = self._probe
        if probe is None or not probe.mended:
            return None
        probe.mended = False
        if self.mode == "fix" and probe.confirmed() and self._repairs() and gated:
            self._repair_begins(optimizer, record, probe)
            record.in_a_row = 0
            return RUN
        return self._nonfinite(optimizer, record, [], gated=gated)

    def _repair_begins(self, optimizer: Any, record: Record, probe: BackwardProbe) -> None:
        repairer = self._repairer
        if repairer is None:
            repairer = self._repairer = Repairer(self._hooks.eager)
        repairer.keys |= probe.makers  # armed once the probe has put torch's functions back
        repairer.quiet = 0
        repairer.repaired += 1  # this step's pass was mended by the probe
        op, line = probe.origin or ("<unknown>", "<unknown>")
        repairer.site = self._sites.site(optimizer)
        self.emit(
            REPAIRED.format(step=record.step, op=op, line=line, passes=len(probe.keys)),
            action="nonfinite_repaired",
            callsite=self._sites.site(optimizer),
            remedy=REPAIR_REMEDY,
            op=op,
            forward=line,
            step=record.step,
            ops=sorted({key[0] for key in probe.makers}),
        )

    def _would_repair(self, probe: BackwardProbe, site: str) -> None:
        """observe: what fix would do once the same node made the values again."""
        if self.mode != "observe" or not probe.confirmed() or not self._repairs():
            return
        op, line = probe.origin or ("<unknown>", "<unknown>")
        self.emit(
            WOULD.format(op=op, line=line, passes=len(probe.keys)),
            action="nonfinite_repaired",
            callsite=site,
            remedy=REPAIR_REMEDY,
            op=op,
            forward=line,
        )

    def _repair_over(self, optimizer: Any) -> None:
        """After a step: read what the repaired passes say; a stalled repair stops. The
        repairer patches and unpatches torch's functions only while no probe has (each
        puts back what it found only where it is still on top)."""
        repairer = self._repairer
        if repairer is None or self._probe is not None or self._repair_stopped:
            return
        if not repairer.armed:
            if repairer.keys and repairer.quiet < REST:
                repairer.arm()
            return
        repairer.drain()
        if repairer.quiet >= REST:  # the singular point is behind: healthy steps pay nothing
            repairer.disarm()
            return
        if repairer.stalled(self.config["stall_steps"]):
            repairer.disarm()
            self._repair_stopped = True
            op = ", ".join(sorted({key[0] for key in repairer.keys}))
            event, site = STALLED.format(steps=repairer.repaired, op=op), repairer.site
            if self.config["on_stall"] == "raise":
                self.refuse(event, action="training_stalled", callsite=site, remedy=REPAIR_REMEDY)
            self.emit(
                event,
                action="training_stalled",
                callsite=site,
                level="error",
                remedy=REPAIR_REMEDY,
                steps=repairer.repaired,
                always=True,
            )

    def _repair_exit(self) -> None:
        repairer = self._repairer
        if repairer is None:
            return
        repairer.disarm()
        repairer.drain()
        if repairer.repaired:
            ops = sorted({key[0] for key in repairer.keys})
            self.emit(
                f"{repairer.repaired} optimizer steps ran with a repaired gradient (the "
                f"non-finite outputs of {', '.join(ops)} set to 0)",
                action="steps_repaired",
                callsite=repairer.site,
                remedy=REPAIR_REMEDY,
                steps=repairer.repaired,
                ops=ops,
            )
