"""grad_audit's verdict on one input of an audited call: the backward's projection against
a finite difference of the forward, counted as a discrepancy only where the difference is
trustworthy.

The model is torch's ``gradcheck(fast_mode=True)``: a random direction ``v`` for the
input, the real incoming gradient ``u`` for the outputs (the one training passed), and
``<backward(u), v>`` (what the real backward returned, dotted with ``v``) against
``<u, (f(x + h v) - f(x - h v)) / 2h>``. A discrepancy must hold at two step sizes (``h``
and ``h/2``) whose central differences agree with each other (the truncation error is
small), where the one-sided differences agree too (the forward is smooth along ``v``:
no kink of relu, abs, clamp or max is crossed), and it must be large: a relative error
over ``RELATIVE`` of the larger side, against a floor that a direction nearly orthogonal
to the gradient cannot fall below. Anything else is inconclusive, and silent.
"""

from __future__ import annotations

import math

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

RELATIVE = 0.1  # the relative error a discrepancy must exceed, at both step sizes
AGREE = {"float64": 0.01, "other": 0.05}  # central differences at h and h/2 must agree
SMOOTH = 0.1  # the one-sided differences at h must agree
FLOOR = 1e-3  # of |u| |J v| + |backward(u)| |v|: below it a projection is noise
# and of |u| |v| rms(f) / rms(x), by the real computation's dtype: what its own rounding
# leaves (a float32 backward of a saturated tanh gives exactly 0 where float64 gives 1e-9)
ROUNDING = {"float64": 1e-10, "other": 1e-4}
# step sizes, relative to the input's scale (its root mean square, at least 1)
STEP = {"float64": 1e-6, "other": 1e-2}


class Projections:
    """The numbers one input's verdict reads (floats)."""

    def __init__(
        self,
        backward: float,
        central: float,
        half: float,
        forward: float,
        backward_side: float,
        scale: float,
        rounding: float = 0.0,
        relative: float = RELATIVE,
    ) -> None:
        self.backward, self.central, self.half = backward, central, half
        self.forward, self.backward_side = forward, backward_side
        self.floor = max(FLOOR * scale, rounding)
        self.relative = relative

    def error(self, numeric: float) -> float:
        """The relative error of the backward's projection against ``numeric``."""
        size = max(abs(self.backward), abs(numeric), self.floor, 1e-300)
        return abs(self.backward - numeric) / size

    def trustworthy(self, kind: str) -> bool:
        """The finite difference is stable across step sizes and smooth along ``v``."""
        floor = self.floor
        stable = abs(self.central - self.half) <= AGREE[kind] * max(
            abs(self.central), abs(self.half), floor
        )
        smooth = abs(self.forward - self.backward_side) <= SMOOTH * max(
            abs(self.forward), abs(self.backward_side), floor
        )
        return stable and smooth and all(map(math.isfinite, self.numbers()))

    def numbers(self) -> tuple[float, ...]:
        return (self.backward, self.central, self.half, self.forward, self.backward_side)

    def wrong(self, kind: str) -> bool:
        """A discrepancy: trustworthy, and over ``relative`` at both step sizes."""
        return (
            self.trustworthy(kind)
            and self.error(self.central) > self.relative
            and self.error(self.half) > self.relative
        )


def kind_of(dtype: Any) -> str:
    return "float64" if str(dtype) == "torch.float64" else "other"


def wrong_event(op: str, position: int, numbers: Projections, kind: str) -> str:
    return (
        f"{op}'s backward disagrees with a finite difference of its forward (argument "
        f"{position}, {'float64' if kind == 'float64' else 'the input dtype'}): "
        f"<backward(u), v> = {numbers.backward:.6g} where the forward gives "
        f"{numbers.central:.6g} (and {numbers.half:.6g} at half the step), a relative "
        f"error of {numbers.error(numbers.central):.3g}: the gradient this Function "
        "returns is wrong, and training follows it"
    )


WRONG_REMEDY = (
    "check the Function's backward against its forward (torch.autograd.gradcheck on "
    "float64 inputs): a sign, a missing term, a stale or reused buffer; or upgrade the "
    "library that defines it. A backward that differs from the derivative by design "
    "(a straight-through or dummy gradient): list the Function in grad_audit's skip "
    'option (skip = ["package.module.Class"], glob patterns allowed)'
)
