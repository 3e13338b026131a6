"""Guard ``pytorch3d_taubin``: ``taubin_smoothing`` is not differentiable at scale.

Symptom: ``pytorch3d.ops.taubin_smoothing`` builds a sparse Laplacian each half-step.
With vertices that require grad, old torch raises "The backward pass for this operation
requires the 'self' tensor to be strided" (pytorch3d#1804, torch 1.12); current torch
runs, but the gradient with respect to the sparse matrix is a dense V x V tensor, so
``ico_sphere(5)`` takes ~20 s and ``ico_sphere(7)`` would need ~107 GB. float64
vertices fail on every version ("expected scalar type Float but found Double").
Affected: every PyTorch3D version (the code is unchanged at HEAD).
Upstream: facebookresearch/pytorch3d#1804.
Remedy: route such calls through ``autograd_guard.taubin.taubin_smoothing``, the same
math on dense tensors, O(E), differentiable twice; a known sparse or dtype error from
the original is retried there too.
"""

from __future__ import annotations

import sys

from autograd_guard.guard import Call, Guard, Option, Target

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Errors the original raises where our path works (old torch; float64 vertices).
KNOWN_ERRORS = (
    "requires the 'self' tensor to be strided",
    "do not have strides",
    "expected scalar type Float but found Double",
    "expected scalar type Float but found",
)


class PyTorch3DTaubin(Guard):
    name = "pytorch3d_taubin"
    distribution = ("pytorch3d", "easypytorch3d")
    affected = ""  # every version
    symptom = "taubin_smoothing backpropagates through a dense V x V matrix, or fails"
    upstream = "https://github.com/facebookresearch/pytorch3d/issues/1804"
    remedy = "use autograd_guard.taubin.taubin_smoothing, which is O(E) and differentiable"
    targets = (
        Target(
            "pytorch3d.ops.mesh_filtering",
            "taubin_smoothing",
            aliases=("pytorch3d.ops:taubin_smoothing",),
        ),
    )
    options = {
        "redirect": Option(
            str, "auto", "auto: only risky calls; always: every call", choices=("auto", "always")
        ),
    }

    def handle(self, call: Call) -> Any:
        meshes = call.argument("meshes", 0)
        reason = self._reason(meshes)
        if reason is None:
            try:
                return call.proceed()
            except RuntimeError as exc:
                if not any(text in str(exc) for text in KNOWN_ERRORS):
                    raise
                if not self._redirect(call, meshes, "fallback", str(exc).split("\n")[0]):
                    raise
                return self._ours(call)
        if self._redirect(call, meshes, "redirect", reason):
            return self._ours(call)
        return call.proceed()

    def _reason(self, meshes: Any) -> str | None:
        if self.config["redirect"] == "always":
            return "policy redirect = always"
        verts = meshes.verts_packed()
        torch = sys.modules["torch"]
        if verts.requires_grad and torch.is_grad_enabled():
            return "vertices require grad: the sparse path is O(V^2) in backward"
        if verts.dtype != torch.float32:
            return f"{verts.dtype} vertices: the sparse path only supports float32"
        return None

    def _redirect(self, call: Call, meshes: Any, action: str, reason: str) -> bool:
        verts = meshes.verts_packed()
        return self.report(
            call,
            action,
            f"taubin_smoothing sent down the dense path: {reason}",
            vertices=int(verts.shape[0]),
            dtype=str(verts.dtype),
            meshes=len(meshes),
        )

    def _ours(self, call: Call) -> Any:
        from autograd_guard.taubin import taubin_smoothing

        meshes = call.argument("meshes", 0)
        lambd = call.argument("lambd", 1, 0.53)
        mu = call.argument("mu", 2, -0.53)
        num_iter = call.argument("num_iter", 3, 10)
        return taubin_smoothing(meshes, lambd=lambd, mu=mu, num_iter=num_iter)


GUARD = PyTorch3DTaubin
