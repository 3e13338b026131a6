"""grad_health's zero-gradient streak: every gradient an optimizer consumed was exactly
zero, step after step, while the loss had a graph (``backward`` ran and made them).

Symptom: the loss never moves and nothing says why; every gradient is a finite 0.0, so
neither the non-finite check (a value that is not finite), nor the lost-gradient check (a
gradient that is missing: ``None``), nor ``training_stalled`` (non-finite steps in a row)
has anything to say. Seen with PyTorch3D's silhouettes rendered hard (``blur_radius=0``
and a ``sigma`` near 0: the sigmoid saturates to exactly 1 inside faces and 0 outside), a
term computed on detached values, a loss mask that is all zero, a ReLU network whose units
have all died. Any library, any torch version. Also, rightly, at an exact stationary point
(a fit converged exactly, a hinge loss every sample satisfies): the words name both.
Remedy: said once per streak (``zero_steps`` steps in a row, a warning in every mode:
the step is not touched), with what to check.

Cost: one ``count_nonzero`` of one gradient (the smallest with an element, or the
smallest last seen holding a value other than zero; a sparse one's stored values), read
with the non-finite flag on CUDA (one sync for both); only a step whose probed gradient
is all zero reads every gradient (one sync per device), and remembers which one was not,
for ``AGAIN`` steps: then the smallest is probed again (a one-value CPU gradient is read
without a kernel; a model whose last bias was exactly 0 at one step would otherwise pay a
``count_nonzero`` of a larger gradient at every step after, ~7 us in a short CPU step).
Gradients without elements are never probed and never make a zero step. Where the flag is
left on the device (a fused optimizer lent it, observe on CUDA) the probe travels with it
and is read when it is ready; one that reads zero makes the next steps read every gradient
(a sync each) until one is not zero. Every step is probed: a probe on one step in a few
would name a streak that begins later only once it has run on past its first probe, and
a streak of ``zero_steps`` to ``zero_steps`` plus the stride never.
"""

from __future__ import annotations

import sys

from autograd_guard.guards.grad_health import zero_params
from autograd_guard.guards.grad_health.check import Probe, gradient_values, parameter_names
from autograd_guard.guards.grad_health.dist import user_names
from autograd_guard.guards.grad_health.step import params_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from autograd_guard.guards.grad_health.dist import Sharing
    from autograd_guard.guards.grad_health.record import Record
    from autograd_guard.guards.grad_health.voice import Voice
    from autograd_guard.guards.grad_health.words import StepSites

AGAIN = 64  # steps the probe stays on a larger gradient before trying the smallest
# Named only where PyTorch3D's renderer is imported: elsewhere it is no lead.
_HARD_SILHOUETTE = (
    ": PyTorch3D's SoftSilhouetteShader with blur_radius=0 and sigma near 0, where "
    "blur_radius around log(1/1e-4 - 1) * sigma and sigma around 1e-4 give gradients"
)


def zero_remedy() -> str:
    """What to check after a zero-gradient streak; PyTorch3D's hard silhouettes only in a
    program that renders with PyTorch3D."""
    silhouette = _HARD_SILHOUETTE if "pytorch3d.renderer" in sys.modules else ""
    return (
        "unless the loss is at an exact optimum, check that it reaches the parameters "
        "through ops with a gradient: a term computed on detached values (.detach(), "
        ".item(), .data, NumPy) plus a zero-weighted one; an op whose gradient is zero "
        f"almost everywhere (round, argmax, a hard threshold, a hard silhouette{silhouette}); "
        "a loss mask or weight that is all zero; a ReLU network whose units are all dead (a "
        "lower learning rate, another initialisation, LeakyReLU). A loss at an exact "
        "stationary point is zero by design: a fit that converged exactly (LBFGS on a "
        "quadratic), a margin or hinge loss that every sample already satisfies "
        "(zero_steps = 0 turns this off)"
    )


def probe(record: Record, grads: list[Any]) -> Probe | None:
    """A flag for the gradient last seen holding a value other than zero, or else the
    smallest. None where no gradient has an element (nothing that could be zero: not a
    zero step, like a step without gradients) and for tensors that hold no values
    (meta, fake)."""
    torch = sys.modules["torch"]
    if 0 <= record.live_until <= record.step:  # the smallest may hold a value again
        record.live = record.live_until = -1
    if not 0 <= record.live < len(grads) or not grads[record.live].numel():
        sized = [i for i, grad in enumerate(grads) if grad.numel()]  # a sparse one's shape
        if not sized:
            return None
        record.live = min(sized, key=lambda i: grads[i].numel())
    grad = grads[record.live]
    if type(grad) is not torch.Tensor or grad.is_meta:
        return None
    return Probe(grad)


def all_zero(record: Record, grads: list[Any], flag: Probe | None) -> bool:
    """Every value of every gradient in ``grads`` (all finite, one at least with an
    element) is exactly zero; the probe is read first, the rest only when it is all zero.
    Gradients without elements are not read; a sparse one's stored values are counted,
    never a dense copy (one with no stored values is zero)."""
    if flag is None or flag.read():
        return False
    torch = sys.modules["torch"]
    by_device: dict[Any, list[int]] = {}
    for index, grad in enumerate(grads):
        if type(grad) is not torch.Tensor or grad.is_meta:
            return False  # no values to read: never said to be zero
        if grad.numel():
            by_device.setdefault(grad.device, []).append(index)
    nonzero: list[int] = []
    for indices in by_device.values():
        flags = torch.stack(
            [torch.count_nonzero(gradient_values(torch, grads[i])) for i in indices]
        )
        nonzero += [i for i, value in zip(indices, flags.tolist(), strict=True) if value]
    if not nonzero:
        return True
    record.live = min(nonzero, key=lambda i: grads[i].numel())  # the cheapest to probe
    record.live_until = record.step + AGAIN
    return False


def held(record: Record, grads: list[Any], probe: Probe | None) -> None:
    """Keep, until the step's end, the gradients a probe left on the device was made for,
    with their versions; a closure's first evaluation only (a later one makes them again)."""
    record.probed = None
    if probe is not None and record.evaluations < 2:
        record.probed = (grads, [g._version for g in grads])


def unchanged(grads: list[Any], before: list[Any], versions: list[int]) -> bool:
    """The same gradient tensors as ``before``, none written in place since."""
    return len(grads) == len(before) and all(
        g is b and g._version == v for g, b, v in zip(grads, before, versions, strict=True)
    )


def counts(record: Record, zero: bool, steps: int) -> bool:
    """Count this step (once, however many closure evaluations it has); True when a
    streak of ``steps`` all-zero steps has just been reached."""
    if record.zero_step == record.step:
        return False
    record.zero_step = record.step
    record.zero_in_a_row = record.zero_in_a_row + 1 if zero else 0
    return bool(steps) and record.zero_in_a_row == steps


def event(kind: str, steps: int, ranks: list[int] | None) -> str:
    where = f" on every rank of its group ({', '.join(map(str, ranks))})" if ranks else ""
    return (
        f"every gradient this {kind} consumed{where} was exactly zero for {steps} optimizer "
        "steps in a row (none missing, none non-finite): the loss is not moving the weights "
        "(momentum or weight decay still may). Either training reached an exact stationary "
        "point (a converged or satisfied loss) or something cuts the gradient off"
    )


class ZeroWatch:
    """The zero-gradient streak (every gradient zero, step after step) and the window of
    an optimizer's first ``zero_steps`` steps (one parameter zero throughout), counted in
    each optimizer's ``Record`` and said once each."""

    def __init__(self, voice: Voice, sites: StepSites) -> None:
        self._voice, self._sites = voice, sites

    def probe_for(self, record: Record, grads: list[Any]) -> Probe | None:
        """A probe for the streak; None when it is off or this step was counted (a
        closure's later evaluation). Every step is probed: a streak of steps not each read
        could not be said to be one."""
        if not self._voice.config["zero_steps"] or record.zero_step == record.step:
            return None
        return probe(record, grads)

    def counted(
        self, optimizer: Any, record: Record, zero: bool, sharing: Sharing | None = None
    ) -> None:
        if counts(record, zero, self._voice.config["zero_steps"]) and (
            sharing is None or sharing.first  # a group's finding: its first rank logs
        ):
            self._streak(optimizer, record, sharing.ranks if sharing is not None else None)

    def read_flag(
        self, optimizer: Any, record: Record, probed: tuple[list[Any], list[int]] | None
    ) -> None:
        """A flag left on the device, read once ready: its probe read zero. At the end of
        its own step, with the gradients the probe was made for still there and unchanged
        (``probed``: the same tensors at the same versions; an optimizer may change or
        free them in its step), every one is read now (a sync) and the step counted.
        Otherwise that step's gradients are gone: it is not counted, and the next steps
        are read at once, before they run (``suspected``)."""
        record.suspect = True
        if probed is None:
            return
        grads = [g for p in params_of(optimizer) if (g := p.grad) is not None]
        if unchanged(grads, *probed):
            self.suspected(optimizer, record, grads)  # this step's, read now

    def suspected(self, optimizer: Any, record: Record, grads: list[Any]) -> None:
        """A flag left on the device: a step after one whose probe read zero reads every
        gradient now (a sync), until one is not zero."""
        if record.suspect:
            flag = self.probe_for(record, grads)
            record.suspect = flag is not None and all_zero(record, grads, flag)
            if flag is not None:
                self.counted(optimizer, record, record.suspect)

    def _streak(self, optimizer: Any, record: Record, ranks: list[int] | None) -> None:
        """Every gradient exactly zero for ``zero_steps`` steps: once per streak, a warning
        in every mode (the steps themselves are not touched)."""
        steps = record.zero_in_a_row
        self._voice.emit(
            event(type(optimizer).__name__, steps, ranks),
            action="zero_gradient",
            callsite=self._sites.site(optimizer),
            remedy=zero_remedy(),
            steps=steps,
            ranks=ranks,
            optimizer=type(optimizer).__name__,
        )

    def window(self, optimizer: Any, record: Record, params: list[Any]) -> None:
        """An optimizer's first ``zero_steps`` finite steps: each one's gradients kept; at
        the last, the parameters whose gradient was exactly zero throughout, named once (a
        warning in every mode)."""
        steps = self._voice.config["zero_steps"]
        zero_params.keep(record, params)
        if record.step < steps or record.sharing is not None:
            return
        zero = zero_params.zero_throughout(record, steps)
        if zero:
            names = user_names(zero, parameter_names(zero), [p.grad for p in zero])
            self._voice.emit(
                zero_params.event(type(optimizer).__name__, names, steps),
                action="zero_gradient_parameter",
                callsite=self._sites.site(optimizer),
                remedy=zero_params.REMEDY,
                parameters=names,
                steps=steps,
                optimizer=type(optimizer).__name__,
            )
