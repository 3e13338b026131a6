"""grad_audit's finite-difference audit of one call, run when the real backward through
the call's node has returned (``backward.watch``): the gradients it returned are judged
against re-runs of the forward on copies of the inputs (``rerun``), input by input
(``verdict``).

Skipped, silently, where the audit could not be sure: a re-run at the unperturbed point
that does not reproduce the real output (a forward that draws from a stream the guard
does not replay, or reads state that changed since); an incoming gradient that is all
zero; an input whose perturbation changes no output at all (an adjoint ODE method reads
its parameters through a closure, an optimal-transport "injector" returns its input and
carries a gradient computed elsewhere: such inputs are skipped, not failed). The
re-runs are in float64 where the forward accepts it and reproduces the real output there
(a float32-only kernel runs in its own dtype, with larger steps).
"""

from __future__ import annotations

import sys

from autograd_guard.guards.grad_audit.verdict import (
    ROUNDING,
    STEP,
    WRONG_REMEDY,
    Projections,
    kind_of,
    wrong_event,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from autograd_guard.guards.grad_audit.rerun import Rerun

INPUTS = 4  # inputs audited per call, at most (each costs four forwards)
SEED = 0x6A7D  # the directions' own generator: the caller's streams are never drawn from


class Audit:
    """One call's audit: its re-runs, its real outputs, the inputs to judge."""

    def __init__(self, rerun: Rerun, outputs: tuple[Any, ...], inputs: list[int]) -> None:
        self.rerun = rerun
        self.outputs = outputs  # the real outputs (detached), None where not differentiable
        self.inputs = inputs  # positions in grad_inputs (torch's order of tensor arguments)
        self.remedy = WRONG_REMEDY

    def event(self, op: str, position: Any, numbers: Projections, kind: str) -> str:
        return wrong_event(op, position, numbers, kind)

    def function(self, op: str) -> str:
        """What the event's ``function`` field names: the Function."""
        return op

    def judge(self, grad_inputs: tuple[Any, ...], grad_outputs: list[Any]) -> list[Any] | str:
        """(argument position, Projections, kind) of each input judged; else why it was
        skipped. The re-run at the unperturbed point comes last: state a forward keeps
        outside its ``ctx`` (a buffer its backward reads) is left as the real forward left
        it. Only running dot products are kept: two perturbed outputs at a time."""
        torch = sys.modules["torch"]
        u = [g if o is not None else None for g, o in zip(grad_outputs, self.outputs, strict=False)]
        if len(grad_outputs) != len(self.outputs) or not any(
            g is not None and bool(g.any()) for g in u
        ):
            return "no incoming gradient to project"
        dtype, wide = self._work_dtype(torch)
        if dtype is None and self._low_precision(torch):
            return "a float16/bfloat16 forward that refuses float64: too coarse to judge"
        positions = self.rerun.tensor_positions()
        elsewhere = self.rerun.elsewhere.changed()  # Megatron's main_grad and the like
        perturbed, passed = [], False
        for index in self.inputs[:INPUTS]:
            if index in elsewhere:
                continue
            grad = grad_inputs[index] if index < len(grad_inputs) else None
            x = positions[index][1]
            if grad is not None and _straight_through(torch, grad, u, x, self.outputs):
                passed = True  # a straight-through backward: defined by design
                continue
            runs = self._perturbed(torch, u, positions[index][1], positions[index][0], dtype)
            if grad is not None and runs is not None:  # None: perturbing changes nothing
                perturbed.append((index, grad, runs))
        base = self.rerun.run({})
        if not same(torch, base, self.outputs, 1e-5):
            return "a re-run at the same point did not reproduce the output"
        at_base = dot(u, wide or base, self.outputs)
        judged = []
        for index, grad, (v, h, dots, size) in perturbed:
            numbers = self._projections(u, grad, v, h, dots, at_base, size, positions[index][1])
            judged.append((positions[index][0], numbers, kind_of(v.dtype)))
        if judged:
            return judged
        if passed:
            return "its backward passes the incoming gradient straight through"
        if elsewhere:
            names = sorted({name for found in elsewhere.values() for name in found})
            return (
                "its backward delivers the gradient elsewhere (it wrote the input's "
                f"{', '.join(names)})"
            )
        return "no input changes the output when perturbed (a closure or injector)"

    def _low_precision(self, torch: Any) -> bool:
        halves = (torch.float16, torch.bfloat16)
        return any(o is not None and o.dtype in halves for o in self.outputs) or any(
            a.dtype in halves for _, a in self.rerun.tensor_positions()
        )

    def _work_dtype(self, torch: Any) -> tuple[Any, tuple[Any, ...] | None]:
        """float64 and the output there, where the forward accepts it and agrees with the
        real output; else (None, None): the input's own dtype."""
        if all(o is None or o.dtype == torch.float64 for o in self.outputs):
            return None, None
        try:
            wide = self.rerun.run({}, torch.float64)
        except Exception:
            return None, None
        outputs = [o for o, r in zip(wide, self.outputs, strict=False) if r is not None]
        if any(o is None or o.dtype != torch.float64 for o in outputs) or not same(
            torch, wide, self.outputs, 1e-3
        ):
            return None, None
        return torch.float64, wide

    def _perturbed(self, torch: Any, u: list[Any], x: Any, where: Any, dtype: Any) -> Any:
        """(v, h, <u, f(x + t v)> for t = h, -h, h/2, -h/2, |u| |f(x + hv) - f(x - hv)| / 2h),
        or None where perturbing changes no output at all."""
        x = x.to(dtype) if dtype is not None else x
        generator = torch.Generator(device=x.device).manual_seed(SEED)
        v = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        h = STEP[kind_of(x.dtype)] * max(1.0, float(x.double().pow(2).mean().sqrt()))
        real = self.outputs
        up = self.rerun.run({where: x + h * v}, dtype)
        down = self.rerun.run({where: x - h * v}, dtype)
        if all(_equal(torch, a, b) for a, b in zip(up, down, strict=True)):
            return None
        size = norm(u) * norm(diffs(up, down, 2 * h, real))
        dots = {h: dot(u, up, real), -h: dot(u, down, real)}
        del up, down
        for t in (h / 2, -h / 2):
            dots[t] = dot(u, self.rerun.run({where: x + t * v}, dtype), real)
        return v, h, dots, size

    def _projections(
        self, u: list[Any], grad: Any, v: Any, h: float, dots: Any, base: float, size: float, x: Any
    ) -> Projections:
        return Projections(
            backward=float((grad.double() * v.double()).sum()),
            central=(dots[h] - dots[-h]) / (2 * h),
            half=(dots[h / 2] - dots[-h / 2]) / h,
            forward=(dots[h] - base) / h,
            backward_side=(base - dots[-h]) / h,
            scale=size + norm([grad]) * norm([v]),
            rounding=self._rounding(u, v, x),
        )

    def _rounding(self, u: list[Any], v: Any, x: Any) -> float:
        """What the real computation's own rounding may leave in a projection:
        ``ROUNDING`` of |u| |v| times the forward's scale, rms(f(x)) / rms(x)."""
        real = [o for o in self.outputs if o is not None]
        kind = kind_of(real[0].dtype) if real else "other"
        outputs = sum(float(o.double().pow(2).mean()) for o in real) ** 0.5
        inputs = float(x.double().pow(2).mean()) ** 0.5 if x.numel() else 0.0
        ratio = outputs / inputs if inputs > 0 else 1.0
        return ROUNDING[kind] * norm(u) * norm([v]) * ratio


def diffs(a: tuple[Any, ...], b: tuple[Any, ...], step: float, real: tuple[Any, ...]) -> list[Any]:
    return [
        (x.double() - y.double()) / step if r is not None and x is not None else None
        for x, y, r in zip(a, b, real, strict=False)
    ]


def dot(u: list[Any], outputs: tuple[Any, ...], real: tuple[Any, ...]) -> float:
    """<u, outputs> over the differentiable outputs, in float64."""
    total = 0.0
    for g, o, r in zip(u, outputs, real, strict=False):
        if g is not None and o is not None and r is not None:
            total += float((g.double() * o.double()).sum())
    return total


def _straight_through(torch: Any, grad: Any, u: list[Any], x: Any, outputs: Any) -> bool:
    """A straight-through estimator: the backward returned an incoming gradient as it is
    (one with no zero: a mask's zeros, as relu's, would make a correct backward look the
    same) for a forward that is the identity on part of its input (a clamp in range, a
    round at integers). A wrong backward that returns its gradient through a forward that
    scales (warp#1728's copy adjoint) is still judged."""
    passed = any(
        g is not None
        and g.shape == grad.shape
        and bool(g.all())
        and torch.equal(g.to(grad.dtype), grad)
        for g in u
    )
    return passed and any(
        o is not None
        and o.shape == x.shape
        and float(((o == x.to(o.dtype)) & (x != 0)).double().mean()) >= 0.1
        for o in outputs
    )


def norm(tensors: list[Any]) -> float:
    return float(sum(float(t.double().pow(2).sum()) for t in tensors if t is not None) ** 0.5)


def _equal(torch: Any, a: Any, b: Any) -> bool:
    return (a is None) == (b is None) and (a is None or torch.equal(a, b))


def same(torch: Any, got: tuple[Any, ...], real: tuple[Any, ...], relative: float) -> bool:
    """The re-run's outputs are the real ones (where differentiable), within ``relative``
    of the largest value."""
    if len(got) != len(real):
        return False
    for g, r in zip(got, real, strict=True):
        if r is None:
            continue
        if g is None or g.shape != r.shape:
            return False
        difference = (g.double() - r.double()).abs()
        if bool(difference.isnan().any()) or _largest(difference) > relative * _largest(r):
            return False
    return True


def _largest(tensor: Any) -> float:
    return float(tensor.double().abs().max()) if tensor.numel() else 0.0
