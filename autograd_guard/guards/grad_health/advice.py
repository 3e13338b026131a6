"""Advice for the ``nonfinite_origin`` event where the op that made the value is a known
singular point of a library function, found from the op's forward stack (anomaly mode's
traceback, which the localiser already reads). A data-like table: the backward op, the
library file and function it ran in, and what to do; a row applies only where all three
match, so the advice is given only where it is true.

PyTorch3D, every version unless a row says otherwise:

- ``corresponding_points_alignment`` (``pytorch3d.ops``, also run by
  ``iterative_closest_point``): the SVD of the cross-covariance of a point set with
  repeated singular values (a symmetric set: a cube's corners, a regular polygon; points
  on a line or a plane) has no defined gradient; ``torch.linalg.svd``'s backward divides by
  the differences of the singular values. R = I and a loss of 0, and a NaN gradient.
- ``matrix_to_euler_angles`` (``pytorch3d.transforms``) at gimbal lock: the central angle
  is ``asin``/``acos`` of +-1 (infinite derivative), the outer ones ``atan2(0, 0)``.
- ``so3_relative_angle``/``so3_rotation_angle``/``so3_log_map``: ``acos`` of the rotation's
  cosine, unbounded at the identity and a half turn. Before 0.5.0 always (upstream
  facebookresearch/pytorch3d 9f14e82, June 2021, added ``cos_bound``); from 0.5.0 only with
  ``cos_bound=0`` (the default 1e-4 extrapolates ``acos`` linearly); ``so3_log_map`` no
  longer uses ``acos`` from 0.7.6 (292acc7).

RoMa, every version (1.2.1 to 1.8.0 checked): ``procrustes_naive`` and
``special_procrustes_naive`` differentiate through torch's SVD, whose backward divides by the
differences of the singular values: NaN at repeated ones (the identity, the usual start of
a fit; a symmetric point set). RoMa's ``procrustes``/``special_procrustes`` compute the same
with their own backward (``gradient_eps``), which holds there.
"""

from __future__ import annotations

import os
import sys

from autograd_guard._common.versions import is_affected

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

SVD_OPS = ("LinalgSvdBackward0", "SvdBackward0", "SvdHelperBackward")
SVD = (
    "the SVD in pytorch3d.ops.corresponding_points_alignment met repeated singular values "
    "(a symmetric or degenerate point set: the corners of a cube, a regular polygon, "
    "points on a line or plane), where torch.linalg.svd's gradient is undefined (R and the "
    "loss are fine, the gradient is NaN): add a little noise to the points (jitter), pass "
    "weights that break the symmetry, or do not backpropagate through the alignment "
    "(detach R and T)"
)
GIMBAL = (
    "pytorch3d.transforms.matrix_to_euler_angles was at gimbal lock (the middle angle at "
    "+-90 degrees for Tait-Bryan axes, 0 or 180 for proper Euler axes), where asin/acos "
    "have an infinite derivative and atan2(0, 0) none: represent rotations as quaternions "
    "or the 6D representation (matrix_to_rotation_6d) and compare them without Euler angles"
)
GIMBAL_GUARD = (
    "; or let the pytorch3d_euler_gimbal guard mend those points (mode fix; it did not "
    "here: it is disabled, observing, or not for this version)"
)
SO3_OLD = (
    "acos in pytorch3d.transforms.{function} at the identity or a half turn (a cosine of "
    "+-1): PyTorch3D {version} calls acos unbounded; PyTorch3D 0.5.0 and later bound it "
    "(cos_bound, default 1e-4): upgrade, or pass cos_angle=True and compare cosines"
)
ROMA_NAIVE = (
    "roma.{function} differentiates through torch's SVD, whose backward divides by the "
    "differences of the singular values: NaN at repeated ones (the identity, the usual "
    "start; a symmetric point set). roma.{fixed} computes the same with a backward that "
    "holds there (gradient_eps): use it"
)
SO3_BOUND = (
    "acos in pytorch3d.transforms.{function} at the identity or a half turn (a cosine of "
    "+-1) with cos_bound=0, which calls acos unbounded: keep cos_bound > 0 (the default "
    "1e-4 extrapolates acos linearly near +-1), or pass cos_angle=True"
)

# (backward ops, library file, functions of that file, advice): the first row whose op,
# file and one function are all in the forward stack applies
TABLE: tuple[tuple[tuple[str, ...], str, tuple[str, ...], str], ...] = (
    (SVD_OPS, "pytorch3d/ops/points_alignment.py", ("corresponding_points_alignment",), SVD),
    (
        ("AsinBackward0", "AcosBackward0", "Atan2Backward0"),
        "pytorch3d/transforms/rotation_conversions.py",
        ("matrix_to_euler_angles",),
        GIMBAL,
    ),
    (
        ("AcosBackward0",),
        "pytorch3d/transforms/so3.py",
        ("so3_relative_angle", "so3_log_map", "so3_rotation_angle"),
        SO3_BOUND,
    ),
    (SVD_OPS, "roma/mappings.py", ("special_procrustes_naive", "procrustes_naive"), ROMA_NAIVE),
)


def advice(op: str, frames: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
    """(the library function, what to do) for ``op`` made in the forward stack ``frames``
    ((file, function), outermost first); None where no row applies."""
    for ops, place, functions, text in TABLE:
        if op not in ops:
            continue
        # the outermost matching frame names the function the user called
        called = next((f for file, f in frames if _in(file, place) and f in functions), None)
        if called is not None:
            module = place[: -len(".py")].replace("/", ".")
            return f"{module}.{called}", _worded(text, called)
    return None


def _in(filename: str, place: str) -> bool:
    return filename.replace(os.sep, "/").endswith("/" + place)


def _worded(text: str, function: str) -> str:
    """The advice as true of the running versions (PyTorch3D's, the guards')."""
    if text is GIMBAL:
        from autograd_guard.guards import BUILTIN

        return GIMBAL + (GIMBAL_GUARD if "pytorch3d_euler_gimbal" in BUILTIN else "")
    if text is ROMA_NAIVE:
        return ROMA_NAIVE.format(function=function, fixed=function.removesuffix("_naive"))
    if text is SO3_BOUND:
        version = str(getattr(sys.modules.get("pytorch3d"), "__version__", "") or "")
        if is_affected(version, "<0.5.0"):
            return SO3_OLD.format(function=function, version=version)
        return SO3_BOUND.format(function=function)
    return text
