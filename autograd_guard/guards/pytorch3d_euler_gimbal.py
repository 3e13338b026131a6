"""Guard ``pytorch3d_euler_gimbal``: ``matrix_to_euler_angles`` has a NaN gradient at
gimbal lock.

Symptom: ``pytorch3d.transforms.matrix_to_euler_angles`` takes the middle angle as
``asin`` of one matrix entry (Tait-Bryan conventions such as ``"XYZ"``) or ``acos`` of a
diagonal entry (proper Euler conventions such as ``"ZYZ"``). At a 90-degree middle angle
(Tait-Bryan; in float32 every angle within about 2e-4 rad of it) or at a zero one
(proper Euler, which includes the identity rotation) that entry is exactly +-1: the
forward is finite (0.7.9 clamps the entry into [-1, 1]), but the derivative of
``asin``/``acos`` there is infinite, and the backward pass gives ``AsinBackward0`` /
``AcosBackward0`` an ``inf`` that meets a zero (the entry is at its maximum) and becomes
NaN. One such rotation in a batch makes the whole gradient non-finite: ``grad_health``
then skips every step and the pose never moves; without it the optimizer writes NaN.
``euler_angles_to_matrix`` (sin and cos) has finite gradients everywhere: no guard. With
torch before 2.13 (2.9.1 and older checked) an exact rotation at the lock (entries 0
beside the +-1, as a quaternion of exactly 45 degrees gives) adds a second NaN: the first and
third angles are ``atan2(0, 0)``, whose backward there is 0/0 (torch 2.13 gives 0).
Affected: every PyTorch3D version (0.7.9 and main clamp the forward only; before 0.7.9 an
entry rounded past +-1 also made the forward NaN), with torch up to at least 2.13 (2.1.2,
2.4.1, 2.6.0, 2.9.1, 2.13.0 checked). torch 2.15.0 is not affected with 0.7.9: there the
backward of ``clamp`` with number bounds is 0 at a bound instead of 1 (the minimum-norm
subgradient, as ``relu`` and ``hardtanh``; pytorch/pytorch#184574 and #184572), and it
selects rather than multiplies, so the ``inf`` of ``asin``/``acos`` at +-1 becomes a 0:
the gradient is finite and the step goes ahead (a pose fit through the lock trains as the
remedy makes it train with torch 2.13, the same losses; a rotation exactly at the lock
gets no gradient from the middle angle, with the remedy as without; 2.14 was not
checked). So the guard asks the library itself, once per process (``nonfinite_at_lock``:
two 3x3 matrices at the lock on the CPU, never the caller's tensors), and where its
gradient there is finite stays out of the way: no event, no sync, the library's own call.
Upstream: facebookresearch/pytorch3d#473 (singularities), #1988 / #1989 (the clamp).
Remedy: the same computation with the middle angle's ``asin``/``acos`` given a finite
derivative: the forward is bit-identical (the library's own ops, in the same order,
clamp included); the backward is torch's own formula wherever that is finite, and at an
entry of exactly +-1 the derivative at the nearest representable entry inside the
interval (``1/sqrt(eps)``: 2896 in float32) instead of ``inf``, and ``atan2`` (the same
call) has torch's backward except a 0 where both arguments are 0. The step then goes ahead
for the other angles, rotations and parameters; at the lock itself the middle angle's
own gradient is zero, as its one-sided derivative through a rotation is. The common path
(angles or quaternions as the parameters) then gets clean gradients (at most 1 at the
lock); where the matrix itself is the parameter (a leaf), the first and third angles'
``atan2`` near (0, 0) gives it a finite but huge gradient at the lock (2e7 in float32,
1e16 in float64): the remedy turns a skipped step into one that may jump.
Cost: where the bug exists, one sync per call whose matrix needs a gradient (counting the
entries at +-1, to decide and to log); none where it does not. Under ``torch.func``: with
``grad``/``jacrev`` the remedy works (its autograd functions have ``setup_context`` and a
generated vmap rule) and the event follows it; under ``vmap`` the count cannot be read,
and the guard stays out of the way (the library's behaviour, no event).
"""

from __future__ import annotations

import sys

from autograd_guard.guard import Call, Guard, Target

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MODULE = "pytorch3d.transforms.rotation_conversions"


class PyTorch3DEulerGimbal(Guard):
    name = "pytorch3d_euler_gimbal"
    distribution = ("pytorch3d", "easypytorch3d")
    affected = ""  # every version: the backward is unchanged at HEAD
    symptom = "matrix_to_euler_angles gives a NaN gradient at gimbal lock (asin/acos of +-1)"
    upstream = "https://github.com/facebookresearch/pytorch3d/issues/473"
    remedy = (
        "the guard's fix mode gives asin/acos a finite derivative at +-1 with the same forward; "
        "or compare rotations (matrices, quaternions) instead of Euler angles"
    )
    targets = (
        Target(
            MODULE,
            "matrix_to_euler_angles",
            aliases=("pytorch3d.transforms:matrix_to_euler_angles",),
        ),
    )

    def risky(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        matrix = kwargs.get("matrix", args[0] if args else None)
        torch = sys.modules["torch"]
        return (
            isinstance(matrix, torch.Tensor)
            and matrix.requires_grad
            and torch.is_grad_enabled()
            and matrix.is_floating_point()
        )

    def handle(self, call: Call) -> Any:
        matrix = call.argument("matrix", 0)
        convention = call.argument("convention", 1)
        middle = _middle_entry(matrix, convention)
        if middle is None or not nonfinite_at_lock(call.original):
            return call.proceed()  # the library refuses it, or its gradient is finite here
        at_lock = _count_at_lock(middle)  # one sync; None under torch.func.vmap
        if not at_lock:
            return call.proceed()
        # The remedy first, the event after: no fix is claimed that did not happen.
        fixed = matrix_to_euler_angles(matrix, convention) if self.mode == "fix" else None
        if not self.report(
            call,
            "finite_gradient",
            f"matrix_to_euler_angles({convention!r}) at gimbal lock: the middle angle's "
            f"{'asin' if convention[0] != convention[2] else 'acos'} gets a finite "
            "derivative instead of inf (its gradient was non-finite: inf or NaN)",
            convention=convention,
            rotations_at_lock=at_lock,
            rotations=int(middle.numel()),
            dtype=str(matrix.dtype),
        ):
            return call.proceed()
        return fixed


def _count_at_lock(middle: Any) -> int | None:
    """How many middle entries are at +-1 (one sync); None where a functorch transform
    (``torch.func.vmap``) makes the count unreadable: the guard then stays out of the way."""
    import torch

    try:
        return int((middle.abs() >= 1.0).sum())
    except RuntimeError:
        if torch._C._functorch.is_functorch_wrapped_tensor(middle):
            return None
        raise


_AT_LOCK: dict[Any, bool] = {}  # the library's function -> its gradient at the lock is not finite


def nonfinite_at_lock(function: Any) -> bool:
    """Whether ``function`` (the library's ``matrix_to_euler_angles``) gives a non-finite
    gradient at gimbal lock with this torch: asked once, then remembered."""
    known = _AT_LOCK.get(function)
    if known is None:
        known = _AT_LOCK[function] = _probe(function)
    return known


def _probe(function: Any) -> bool:
    """The middle angle's gradient at a 90-degree pitch ("XYZ", asin) and at the identity
    ("ZYZ", acos): two float32 3x3 matrices on the CPU."""
    import torch

    def middle(matrices: Any) -> Any:
        return function(matrices[0], "XYZ")[1] + function(matrices[1], "ZYZ")[1]

    pitch = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [-1.0, 0.0, 0.0]])
    # torch.func.grad: it works inside and outside functorch transforms (autograd.grad
    # does not inside torch.func.grad), with the same derivative formulas.
    with torch.enable_grad():
        grad = torch.func.grad(middle)(torch.stack((pitch, torch.eye(3))))
    return not bool(torch.isfinite(grad).all())


def _middle_entry(matrix: Any, convention: Any) -> Any:
    """The matrix entry whose asin/acos is the middle angle; None where the library would
    refuse the arguments (it then raises its own error)."""
    axes = "XYZ"
    if (
        not isinstance(convention, str)
        or len(convention) != 3
        or any(letter not in axes for letter in convention)
        or convention[1] in (convention[0], convention[2])
        or matrix.dim() < 2
        or tuple(matrix.shape[-2:]) != (3, 3)
    ):
        return None
    i0, i2 = axes.index(convention[0]), axes.index(convention[2])
    return matrix[..., i0, i2].detach()


def matrix_to_euler_angles(matrix: Any, convention: str) -> Any:
    """``pytorch3d.transforms.matrix_to_euler_angles`` with a finite derivative of the
    middle angle at +-1; the forward is the library's, op for op."""
    import torch

    rotation_conversions = sys.modules.get(MODULE) or __import__(MODULE, fromlist=["_"])
    i0 = rotation_conversions._index_from_letter(convention[0])
    i2 = rotation_conversions._index_from_letter(convention[2])
    tait_bryan = i0 != i2
    if tait_bryan:
        entry = torch.clamp(matrix[..., i0, i2], -1.0, 1.0) * (-1.0 if i0 - i2 in [-1, 2] else 1.0)
        central_angle = _FiniteAsin.apply(entry)
    else:
        central_angle = _FiniteAcos.apply(torch.clamp(matrix[..., i0, i0], -1.0, 1.0))
    first = _angle_from_tan(convention[0], convention[1], matrix[..., i2], False, tait_bryan)
    third = _angle_from_tan(convention[2], convention[1], matrix[..., i0, :], True, tait_bryan)
    return torch.stack((first, central_angle, third), -1)


def _angle_from_tan(axis: str, other: str, data: Any, horizontal: bool, tait_bryan: bool) -> Any:
    """The library's ``_angle_from_tan`` (the same entries, signs and ``atan2``) with
    ``_atan2`` for ``torch.atan2``."""
    i1, i2 = {"X": (2, 1), "Y": (0, 2), "Z": (1, 0)}[axis]
    if horizontal:
        i2, i1 = i1, i2
    if horizontal == ((axis + other) in ("XY", "YZ", "ZX")):
        return _atan2(data[..., i1], data[..., i2])
    if tait_bryan:
        return _atan2(-data[..., i2], data[..., i1])
    return _atan2(data[..., i2], -data[..., i1])


def _atan2(y: Any, x: Any) -> Any:
    """``torch.atan2`` (the same call) with a zero gradient where both arguments are zero
    (the first and third angles at the lock; torch before 2.13 gives NaN there, 0/0)."""
    if _Atan2.function is None:
        _Atan2.function = _zero_safe_atan2()
    return _Atan2.function.apply(y, x)  # type: ignore[attr-defined]


def _zero_safe_atan2() -> type:
    import torch

    class ZeroSafeAtan2(torch.autograd.Function):
        generate_vmap_rule = True  # and setup_context: usable under torch.func

        @staticmethod
        def forward(y: Any, x: Any) -> Any:
            return torch.atan2(y, x)

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            ctx.save_for_backward(*inputs)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            # torch's own formula (atan2_backward), with (0, 1) where both are 0.
            y, x = ctx.saved_tensors
            both_zero = (y == 0) & (x == 0)
            y = torch.where(both_zero, torch.zeros_like(y), y)
            x = torch.where(both_zero, torch.ones_like(x), x)
            recip = (y * y + x * x).reciprocal()
            zero = torch.zeros_like(grad)
            return (
                torch.where(both_zero, zero, grad * x * recip),
                torch.where(both_zero, zero, grad * -y * recip),
            )

    return ZeroSafeAtan2


class _Atan2:
    function: type | None = None


def _bounded_rsqrt(x: Any) -> Any:
    """``1 / sqrt(1 - x*x)`` as torch's asin/acos backward computes it, with ``1 - x*x``
    kept at least ``eps`` of the dtype (the value at the nearest entry inside (-1, 1))."""
    import torch

    one_minus = -x * x + 1
    return one_minus.clamp_min(torch.finfo(x.dtype).eps).rsqrt()


def _finite_function(name: str, sign: float) -> type:
    import torch

    forward_op = getattr(torch, name)

    class Finite(torch.autograd.Function):
        generate_vmap_rule = True  # and setup_context: usable under torch.func

        @staticmethod
        def forward(x: Any) -> Any:
            return forward_op(x)

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
            ctx.save_for_backward(*inputs)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            (x,) = ctx.saved_tensors
            return grad * _bounded_rsqrt(x) * sign

    Finite.__name__ = Finite.__qualname__ = f"Finite{name.capitalize()}"
    return Finite


class _Lazy:
    """The autograd functions, made on first use (importing this module imports no torch)."""

    def __init__(self, name: str, sign: float) -> None:
        self.name, self.sign = name, sign
        self.function: type | None = None

    def apply(self, x: Any) -> Any:
        if self.function is None:
            self.function = _finite_function(self.name, self.sign)
        return self.function.apply(x)  # type: ignore[attr-defined]


_FiniteAsin = _Lazy("asin", 1.0)
_FiniteAcos = _Lazy("acos", -1.0)

GUARD = PyTorch3DEulerGimbal
