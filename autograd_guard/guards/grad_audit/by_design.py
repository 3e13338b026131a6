"""grad_audit: library Functions whose backward differs from the derivative on purpose,
recognised from the call's own arguments (the ``skip`` option names the rest).

Symptom (a false ``wrong_gradient``): RoMa's ``procrustes(M, regularization=r)``
(``roma.mappings._ProcrustesManualDerivatives``; the option is in every release read,
1.3.0 to 1.6.0): for ``r != 0`` its backward adds ``r * (M - R)`` to the gradient, the
gradient of a loss term ``r/2 |M - R|^2`` that the forward does not compute (documented
in ``procrustes``'s docstring). On RoMa 1.6.0, a batch of 16: 0.1 and 1.0 stayed within
the audit's tolerances, 10 was named ``wrong_gradient``.
https://github.com/naver/roma/blob/master/roma/mappings.py

Remedy: such a call is not audited, and the exit note says why; the same Function called
with ``r = 0`` still is.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# qualified name: (position of the argument, its name, what it does to the backward)
KNOWN: dict[str, tuple[int, str, str]] = {
    "roma.mappings._ProcrustesManualDerivatives": (
        2,
        "regularization",
        "adds regularization * (M - R) to the gradient",
    ),
}


def by_design(op: str, args: tuple[Any, ...]) -> str | None:
    """Why this call's backward differs from its derivative by design, or None."""
    known = KNOWN.get(op)
    if known is None:
        return None
    position, name, what = known
    value = _number(args[position] if position < len(args) else None)
    if value is not None and value != 0:
        return f"{name}={value:g}: its backward {what} by design"
    return None


def _number(value: Any) -> float | None:
    """A Python, NumPy or one-element tensor number, as a float; None for anything else."""
    if value is None or isinstance(value, str):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
