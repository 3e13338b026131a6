"""Guard ``pytorch3d_face_normals``: the gradient of PyTorch3D's face normals is wrong.

Symptom: ``pytorch3d.ops.mesh_face_areas_normals`` (``Meshes.faces_normals_packed()``,
``faces_areas_packed()`` and their list/padded forms) returns the right areas and
normals, but the gradient its compiled backward gives the vertices through the normals is
wrong: one term of the z gradient of each face's second vertex uses ``cx`` where the
derivative has ``cy`` (``grad_v1_z``, the ``grad_normals[1]`` term, in
``pytorch3d/csrc/face_areas_normals/face_areas_normals_cpu.cpp`` and the same line of
``face_areas_normals.cu``). On a noisy ``ico_sphere(2)`` with random weights on the
normals the vertices' gradient is 37 % off (relative L2 error against autograd through the
same maths and against finite differences of the library's own forward; cosine 0.94); the
x and y gradients and the areas' gradient are right, so PyTorch3D's own test, which
back-propagates the areas only, passes. ``Meshes.verts_normals_packed()`` computes its
normals in plain torch and is right.
Affected: every PyTorch3D version with the compiled op (0.1.1 on; checked on
easypytorch3d 0.7.9.post1's CPU kernel; the CUDA kernel carries the same line, unrun).
Upstream: none filed; the kernel source is linked below.
Remedy: a call whose vertices need a gradient (they require grad and grad mode is on)
returns the library's own areas (its output, its backward: areas-only code is the library's
bit for bit, its areas once differentiable as unguarded) beside normals computed by
``face_areas_normals`` below: plain torch, the kernel's float32 arithmetic in its order
(bit-identical on the CPU), differentiable twice. The library's normals are dropped: its
backward gets a zero gradient for them, as when the caller uses only the areas. Every
other call runs the library alone. The bug bites only where the normals receive a
gradient: a hook on the normals decides in ``backward()``, so a call whose normals get none
(only the areas are used, or the normals only without grad) or an all-zero one logs
nothing. ``fix`` logs the corrected gradient once per call site; ``observe`` runs the
library and names the call; ``strict`` raises from ``backward()`` (the normals are plain
torch's: no wrong gradient reaches the vertices).
"""

from __future__ import annotations

import sys

from autograd_guard.errors import GuardError, drop_own_frames
from autograd_guard.guard import Call, Guard, Target, argument

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    import torch

KERNEL = (
    "https://github.com/facebookresearch/pytorch3d/blob/main/"
    "pytorch3d/csrc/face_areas_normals/face_areas_normals_cpu.cpp"
)
# What the guard says when the normals receive a gradient, by mode.
EVENTS = {
    "fix": "the gradient through mesh_face_areas_normals' normals was corrected (plain "
    "torch): the compiled backward's is wrong",
    "observe": "mesh_face_areas_normals' normals received a gradient, which the compiled "
    "backward gets wrong",
    "strict": "mesh_face_areas_normals' normals received a gradient, which the compiled "
    "backward gets wrong",
}


def face_areas_normals(
    verts: torch.Tensor, faces: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mesh_face_areas_normals`` in plain torch: areas ``|c| / 2`` and normals
    ``c / max(|c|, 1e-6)`` of ``c = (v1 - v0) x (v2 - v0)``, in float32 whatever the
    vertices' dtype, as the kernel computes them. A face of zero area gets a zero area
    gradient (the kernel's value), not the NaN of ``sqrt``'s derivative at zero."""
    torch = sys.modules["torch"]
    verts = verts.float()
    v0, v1, v2 = verts[faces[:, 0]], verts[faces[:, 1]], verts[faces[:, 2]]
    ax, ay, az = (v1 - v0).unbind(1)
    bx, by, bz = (v2 - v0).unbind(1)
    cx, cy, cz = ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx
    squared = cx * cx + cy * cy + cz * cz
    positive = squared > 0
    norm = torch.where(positive, _sqrt(torch.where(positive, squared, 1.0)), 0.0)
    normals = torch.stack((cx, cy, cz), dim=1) / norm.clamp(min=1e-6).unsqueeze(1)
    return norm / 2, normals


def _sqrt(value: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root the kernel's ``sqrtss`` gives: torch's own float32
    ``sqrt`` on the CPU is off by one unit in the last place for ~15 % of values."""
    return value.double().sqrt().to(value.dtype)


class PyTorch3DFaceNormals(Guard):
    name = "pytorch3d_face_normals"
    distribution = ("pytorch3d", "easypytorch3d")
    affected = ">=0.1.1"  # the compiled op and its backward, unchanged since
    symptom = "mesh_face_areas_normals back-propagates a wrong gradient through the normals"
    upstream = KERNEL
    remedy = "compute the normals in plain torch, whose gradient is right"
    targets = (
        Target(
            "pytorch3d.ops.mesh_face_areas_normals",
            "mesh_face_areas_normals",
            aliases=(
                "pytorch3d.ops:mesh_face_areas_normals",
                "pytorch3d.ops.sample_points_from_meshes:mesh_face_areas_normals",
            ),
        ),
    )

    def risky(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Vertices that need a gradient, in the shapes and on the devices the library
        accepts (anything else goes to the library, which raises its own errors)."""
        torch = sys.modules.get("torch")
        verts = argument(args, kwargs, "verts", 0)
        faces = argument(args, kwargs, "faces", 1)
        return (
            torch is not None
            and isinstance(verts, torch.Tensor)
            and isinstance(faces, torch.Tensor)
            and verts.requires_grad
            and torch.is_grad_enabled()
            and verts.device.type in ("cpu", "cuda")  # where the library has a kernel
            and verts.dim() == 2
            and verts.shape[1] == 3
            and faces.dim() == 2
            and faces.shape[1] == 3
            and faces.dtype == torch.int64
        )

    def handle(self, call: Call) -> Any:
        verts, faces = call.argument("verts", 0), call.argument("faces", 1)
        result = call.proceed()
        if self.mode != "observe":  # the library's areas, with its own (right) backward
            result = (result[0], face_areas_normals(verts, faces)[1])
        fields = {
            "target": str(call.target),
            "faces": int(faces.shape[0]),
            "dtype": str(verts.dtype),
            "device": str(verts.device),
        }
        self._watch(result[1], call.callsite, fields)
        return result

    def _watch(self, normals: torch.Tensor, callsite: str, fields: dict[str, Any]) -> None:
        """Decide in ``backward()``: the gradient is wrong only where the normals get one.
        The hook holds the call site captured now, not the normals (no reference cycle)."""

        def autograd_guard_hook(grad: torch.Tensor | None) -> None:
            try:
                if grad is not None and _nonzero(grad):
                    self.report(callsite, "redirect", EVENTS[self.mode], **fields)
            except GuardError as strict:
                drop_own_frames(strict)  # this raise adds back one: its own
                raise strict  # autograd-guard strict: the message says why
            except Exception as exc:
                self.fail("backward", exc)

        if normals.requires_grad:  # always here; register_hook raises on one without
            normals.register_hook(autograd_guard_hook)  # type: ignore[no-untyped-call]


def _nonzero(grad: torch.Tensor) -> bool:
    """Whether any entry of the normals' gradient is nonzero (one sync on an accelerator);
    True where that cannot be read (under ``torch.func.vmap``): the bug may bite there."""
    try:
        return bool(grad.any())
    except RuntimeError:
        return True


GUARD = PyTorch3DFaceNormals
