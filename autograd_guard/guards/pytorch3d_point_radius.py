"""Guard ``pytorch3d_point_radius``: a per-point radius passed to the point rasterizer
never gets a gradient.

Symptom: ``pytorch3d.renderer.points.rasterize_points`` (and ``PointsRasterizer`` with
``PointsRasterizationSettings(radius=<tensor>)``) accepts a per-point radius tensor of
shape (N, P), and the rendered image depends on it (which pixels each point covers, and
``dists``), but ``_RasterizePoints.backward`` returns None for it: after ``backward()``
``radius.grad`` is None, the optimizer skips it, and the radii never train while the
positions do. Nothing is said; ``grad_health`` only reports a ``lost_gradient`` many
steps later, and strict does not stop the run.
Affected: every PyTorch3D version (the backward is unchanged at HEAD).
Upstream: facebookresearch/pytorch3d#1562 ("How to optimize point radiuses").
Remedy: none in the library, so none here: the guard names it at the first call where a
radius that requires grad reaches the rasterizer with grad mode on (once per call site;
``strict`` raises before the call), saying what works instead.
"""

from __future__ import annotations

import sys

from autograd_guard.guard import Call, Guard, Target

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MODULE = "pytorch3d.renderer.points.rasterize_points"


class PyTorch3DPointRadius(Guard):
    name = "pytorch3d_point_radius"
    distribution = ("pytorch3d", "easypytorch3d")
    affected = ""  # every version
    symptom = "a per-point radius tensor passed to the point rasterizer gets no gradient"
    upstream = "https://github.com/facebookresearch/pytorch3d/issues/1562"
    remedy = (
        "PyTorch3D's point rasterizer cannot differentiate radius: pass radius.detach() to "
        "say so; to learn sizes, make them act after rasterization (per-point weights or "
        "alphas in the compositor, e.g. 1 - dists / r[fragments.idx]**2) or use the pulsar "
        "renderer (pytorch3d.renderer.points.pulsar), whose radii get gradients"
    )
    targets = (
        Target(
            MODULE,
            "rasterize_points",
            aliases=(
                "pytorch3d.renderer.points.rasterizer:rasterize_points",
                "pytorch3d.renderer.points:rasterize_points",
                "pytorch3d.renderer:rasterize_points",
            ),
        ),
    )

    def risky(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        radius = kwargs.get("radius", args[2] if len(args) > 2 else None)
        torch = sys.modules["torch"]
        return isinstance(radius, torch.Tensor) and radius.requires_grad and torch.is_grad_enabled()

    def handle(self, call: Call) -> Any:
        radius = call.argument("radius", 2)
        self.report(
            call,
            "radius_not_differentiable",
            "a radius tensor that requires grad reaches PyTorch3D's point rasterizer, "
            "which returns no gradient for it: radius.grad will stay None and the radii "
            "will not train",
            radius_shape=list(radius.shape),
            dtype=str(radius.dtype),
        )
        return call.proceed()


GUARD = PyTorch3DPointRadius
