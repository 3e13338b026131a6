"""grad_health's parameters without a gradient, told apart by what the forward pass did:
*lost* (its module ran, and the gradient never came back), *unused* (its module never ran),
and a step with no gradient at all.

Symptom: a parameter that never gets a gradient is a bug when its module ran in the forward
pass (``.detach()``, ``.data``, ``torch.no_grad``, a NumPy round trip: it never trains), and
no bug when its module never ran (a layer defined and never called, an optional head, an
expert no token was routed to: a test suite's or a framework's deliberate setup). Told
apart, strict fails only on the first. And an optimizer whose every parameter has no
gradient, step after step, trains nothing at all: ``zero_grad()`` between ``backward()`` and
``step()`` (torch's default ``set_to_none=True`` leaves every ``.grad`` None), no
``backward()`` call, or ``backward()`` on a detached loss. Any torch version.
Remedy: ``lost_gradient`` (a finding: strict raises at the step, or ends the run with status
3) for parameters whose module ran; ``unused_parameter`` (a note, once per call site, never a
failure) for those whose module did not; ``no_gradient`` (a finding, as ``lost_gradient``)
after ``lost_steps`` steps in a row without any gradient while the parameters' modules ran,
or at exit for a shorter run. What cannot be known is never a strict failure: a parameter
outside any module, gradients set by hand with no forward pass (a warning at most).

Cost: nothing on a healthy step. A forward watch (``torch.nn.Module``'s global forward
pre-hook, noting each called module's own parameters) is on for one step's forward passes
only: the step after one where some parameter still waited for its first gradient, or the
first of a streak without gradients; and at most ``forward.WATCH_CALLS`` module calls.
"""

from __future__ import annotations

import sys

from autograd_guard.guards.grad_health.check import parameter_names
from autograd_guard.guards.grad_health.findings import strict_finding
from autograd_guard.guards.grad_health.forward import ForwardWatch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from autograd_guard.guards.grad_health.compile import EagerHooks
    from autograd_guard.guards.grad_health.record import Record
    from autograd_guard.guards.grad_health.voice import Voice
    from autograd_guard.guards.grad_health.words import StepSites

LOST_REMEDY = (
    "find where the parameter leaves the autograd graph (.detach(), .data, torch.no_grad, "
    "a NumPy round trip), or set requires_grad=False if it is meant to stay frozen"
)
UNUSED_REMEDY = (
    "if the layer is meant to run, call it in forward; if not (an optional head, an "
    "unrouted expert), nothing is wrong: set requires_grad=False or leave it out of the "
    "optimizer to say so"
)
NO_GRADIENT_REMEDY = (
    "call optimizer.zero_grad() before loss.backward() (or at the top of the loop), never "
    "between backward() and step(); call loss.backward() before optimizer.step(); and keep "
    "the loss attached to the graph (no .detach(), .item(), .data, torch.no_grad or NumPy "
    "on the way to it)"
)
FLOOR = 3  # steps of a run shorter than lost_steps that say anything at exit
UNKNOWN = "belongs to no module, so whether it was used in the forward pass cannot be known"


def read(record: Record, params: list[Any], new_params: bool) -> None:
    """Before a step's lost-gradient count: a watch that saw a step's forward passes (or
    whose parameters changed) is read and closed; parameters added are watched anew. The
    names of those still waiting are kept (one scan of live modules, where there are any):
    an optimizer freed after its model says them at exit."""
    watch = record.watch
    if watch is not None and (record.step > watch.step or new_params):
        watch.close()
        record.watch = None
        record.ran, record.forward = watch.seen, bool(watch.calls)
        record.empty_judged = any(id(p) in watch.seen for p in params if p.requires_grad)
        waiting = [p for p, _ in record.waiting.values()]
        names = parameter_names(waiting) if waiting else []  # for after their modules are gone
        record.names = {
            id(p): name for p, name in zip(waiting, names, strict=True) if not name.startswith("<")
        }
    if new_params:
        record.ran = None


def begin(record: Record, eager: Callable[[Any], Any]) -> None:
    """After it: a watch begins where parameters wait for a first gradient and nothing is
    known of their modules yet; one is closed early when none waits any more."""
    if record.watch is None:
        if record.waiting and record.ran is None:
            record.watch = ForwardWatch(record.step, eager)
    elif not record.waiting and not record.empty:
        record.watch.close()
        record.watch = None


def sort(record: Record, params: list[Any]) -> tuple[list[Any], list[Any], list[Any]]:
    """(lost, unused, unknown): its module ran; its module never ran; nothing is known
    (outside any module, or never watched)."""
    if record.ran is None:
        return [], [], list(params)
    names = parameter_names(params)
    lost, unused, unknown = [], [], []
    for param, name in zip(params, names, strict=True):
        if id(param) in record.ran:
            lost.append(param)
        elif name.startswith("<unnamed"):
            unknown.append(param)
        else:
            unused.append(param)
    return lost, unused, unknown


def _on_purpose(record: Record) -> bool:
    """No gradient is meant to come: the step's closure returned no loss (Lightning's
    ``training_step`` returning None skips backward), or ``Tensor.backward`` is a test's
    mock."""
    if record.evaluations and record.no_loss:
        return True
    mock = sys.modules.get("unittest.mock")
    backward = sys.modules["torch"].Tensor.backward
    return mock is not None and isinstance(backward, mock.NonCallableMock)


def no_gradient_words(kind: str, steps: int, judged: bool, forward: bool) -> str:
    what = f"every parameter of this {kind} had no gradient (.grad is None) in {steps} steps"
    if judged:
        return (
            f"{what} in a row while its modules ran in the forward pass: nothing trains "
            "(zero_grad() between backward() and step()? no backward() call? a detached loss?)"
        )
    if forward:
        return f"{what} in a row and its modules never ran in the forward pass: nothing trains"
    return (
        f"{what} in a row, and no forward pass ran through its parameters' modules (or they "
        "belong to none), so what cut the gradient cannot be known: nothing trains"
    )


class Usage:
    """Parameters without a gradient, and steps without any: counted per optimizer (in
    its ``Record``), told apart by what the forward pass did, and said."""

    def __init__(self, voice: Voice, hooks: EagerHooks, sites: StepSites) -> None:
        self._voice, self._hooks, self._sites = voice, hooks, sites

    def check(self, optimizer: Any, record: Record, params: list[Any]) -> None:
        """Before a step whose optimizer has parameters still waiting for a first
        gradient, or a forward watch open, or new parameters: count, watch, name."""
        lost_steps = self._voice.config["lost_steps"]
        if (
            lost_steps
            and record.evaluations <= 1
            and (record.waiting or record.watch is not None or len(params) != record.known)
        ):  # on a healthy step, once every parameter has had a gradient: nothing to do
            new = len(params) != record.known
            read(record, params, new)
            lost = record.lost(params, lost_steps) if record.waiting or new else []
            begin(record, self._hooks.eager)
            if lost:
                self._report_lost(optimizer, record, lost)

    def no_gradient(self, optimizer: Any, record: Record, params: list[Any]) -> None:
        """A step where no parameter had a gradient (frozen ones left out)."""
        steps = self._voice.config["lost_steps"]
        if not steps or not any(p.requires_grad for p in params) or _on_purpose(record):
            return
        if any(p.grad is not None for p in params):  # a shard's own gradients may be none
            record.empty = 0
            return
        record.empty += 1
        if record.empty == 1 and record.watch is None and record.ran is None:
            record.watch = ForwardWatch(record.step, self._hooks.eager)
        if record.empty == steps:
            self._report_no_gradient(optimizer, record, steps)

    def _report_lost(
        self, optimizer: Any, record: Record, due: list[Any], steps: int = 0, site: str = ""
    ) -> None:
        """Parameters that got no gradient in ``steps`` steps (each once): a finding where
        their module ran; a note where it never did; a warning where nothing is known.
        In strict, a finding stops the step (or, at exit, sets the status)."""
        steps = steps or self._voice.config["lost_steps"]
        site = site or self._sites.site(optimizer)
        lost, unused, unknown = sort(record, due)
        if unused:
            shapes = [tuple(p.shape) for p in unused]
            self._usage_note(site, parameter_names(unused), shapes, steps, record)
        if unknown:
            self._lost_event(optimizer, site, parameter_names(unknown), unknown, steps, False)
        if lost:
            self._lost_event(optimizer, site, parameter_names(lost), lost, steps, True)

    def _lost_event(
        self,
        optimizer: Any,
        site: str,
        names: list[str],
        params: list[Any] | None,
        steps: int,
        known: bool,
        owner: str = "",
        shapes: list[tuple[int, ...]] | None = None,
    ) -> None:
        what = f"{len(names)} parameter(s){owner} got no gradient in {steps} optimizer steps "
        what += "while the others did"
        if known:
            event = f"{what}, though their modules ran in the forward pass: {', '.join(names)}"
        else:
            why = UNKNOWN if params is not None else "was never watched in a forward pass"
            event = f"{what}: {', '.join(names)} (each {why}; never a strict failure)"
        fields = {
            "remedy": LOST_REMEDY,
            "parameters": names,
            "shapes": [list(p.shape) for p in params] if params is not None else shapes,
        }
        fails = known and self._voice.mode == "strict"
        if fails and optimizer is not None:
            self._voice.refuse(event, action="lost_gradient", callsite=site, **fields)
        level = "error" if fails else "warning"
        self._voice.emit(event, action="lost_gradient", callsite=site, level=level, **fields)
        if fails:
            strict_finding()

    def _report_no_gradient(
        self, optimizer: Any, record: Record, steps: int, retired: bool = False
    ) -> None:
        """No parameter had a gradient for ``steps`` steps in a row: a finding where their
        modules ran in the forward pass; a warning where that is not known."""
        known = record.empty_judged
        kind = record.kind or type(optimizer).__name__
        event = no_gradient_words(kind, steps, known, record.forward)
        if retired:
            event = f"{event} (the {kind} was gone before exit)"
        site = record.site or "-" if optimizer is None else self._sites.site(optimizer)
        fails = known and self._voice.mode == "strict"
        if fails and optimizer is not None:
            self._voice.refuse(
                event, action="no_gradient", callsite=site, remedy=NO_GRADIENT_REMEDY
            )
        level = "error" if fails else "warning"
        fields = {"steps": steps, "optimizer": kind, "remedy": NO_GRADIENT_REMEDY}
        self._voice.emit(event, action="no_gradient", callsite=site, level=level, **fields)
        if fails:
            strict_finding()

    def at_exit(self, record: Record) -> None:
        """A run shorter than ``lost_steps``: what it left without a gradient."""
        window = self._voice.config["lost_steps"]
        if not window:
            return
        if FLOOR <= record.empty < window:
            self._report_no_gradient(None, record, record.empty, retired=record.gone)
        lost = [] if record.gone else record.never_trained(FLOOR)
        if lost:
            self._report_lost(None, record, lost, steps=record.step, site=record.site or "-")
        elif record.gone:
            site, gone = record.site or "-", f" of a {record.kind} gone before exit"
            if record.unknown_shapes:
                shapes = record.unknown_shapes
                names = [f"<a parameter of shape {shape}>" for shape in shapes]
                self._lost_event(None, site, names, None, record.step, False, gone, shapes)
            if record.lost_shapes:
                names = [name for name, _ in record.lost_shapes]
                shapes = [shape for _, shape in record.lost_shapes]
                self._lost_event(None, site, names, None, record.step, True, gone, shapes)
            if record.unused_shapes:
                names = [name for name, _ in record.unused_shapes]
                shapes = [shape for _, shape in record.unused_shapes]
                self._usage_note(site, names, shapes, record.step, record, gone)

    def _usage_note(
        self,
        site: str,
        names: list[str],
        shapes: list[tuple[int, ...]],
        steps: int,
        record: Record,
        owner: str = "",
    ) -> None:
        how = (
            "their modules never ran in the forward pass (defined but never called in forward?)"
            if record.forward
            else "no module ran a forward pass while they were watched (gradients set by hand?)"
        )
        self._voice.emit(
            f"{len(names)} parameter(s){owner or f' of this {record.kind}'} got no gradient in "
            f"{steps} optimizer steps and {how}: {', '.join(names)}",
            action="unused_parameter",
            callsite=site,
            level="info",
            remedy=UNUSED_REMEDY,
            parameters=names,
            shapes=[list(shape) for shape in shapes],
        )
