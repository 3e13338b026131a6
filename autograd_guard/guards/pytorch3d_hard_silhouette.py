"""Guard ``pytorch3d_hard_silhouette``: a soft silhouette rendered with ``blur_radius=0``
gives the geometry no useful gradient.

Symptom: ``SoftSilhouetteShader`` blends ``sigmoid(-dists / sigma)`` over the faces the
rasterizer found for each pixel. With ``RasterizationSettings(blur_radius=0)`` a pixel
outside the mesh has no face at all, so nothing pulls the silhouette's edge outwards,
and inside it the sigmoid saturates to exactly 1 unless the pixel centre lies within
about ``sqrt(17 * sigma)`` of an edge. For ``sigma`` of 1e-10 or less every gradient is
then exactly 0.0; for the default 1e-4 the only gradients come from seams between faces
inside the silhouette. A camera or shape fit on such a silhouette does not converge
(the loss wanders by a few percent where the tutorial's settings cut it by a fifth in
the same 40 steps), and nothing is said: the settings asked about in pytorch3d#344.
Affected: every PyTorch3D version (a property of the settings, not a regression).
Upstream: facebookresearch/pytorch3d#344; ``SoftSilhouetteShader``'s docstring and the
tutorials (``fit_textured_mesh``, ``camera_position_optimization``) give the settings.
Remedy: none to apply (the settings are the user's). The settings hurt only where the
silhouette is trained on: a hook on the rendered image decides in ``backward()``, so a hard
silhouette rendered for a metric, a picture or a mask (detached, or left out of the loss)
logs nothing. One whose silhouette (alpha) receives a nonzero gradient is named once per
forward call site, with the numbers to use; ``strict`` raises from ``backward()``, before
any gradient reaches the geometry or the camera.
Soft RGB shaders (``SoftPhongShader``...) are left alone: their colours carry shading
gradients with ``blur_radius=0``, so an event there would fire on working code.
"""

from __future__ import annotations

import math
import sys

from autograd_guard.errors import GuardError, drop_own_frames
from autograd_guard.guard import Call, Guard, Target

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    import torch

MODULE = "pytorch3d.renderer.mesh.renderer"
SHADER_MODULE = "pytorch3d.renderer.mesh.shader"
# The tutorials' blur: the sigmoid falls to 1e-4 at the blurred edge.
BLUR_PER_SIGMA = math.log(1.0 / 1e-4 - 1.0)
TUTORIAL_FACES_PER_PIXEL = 50


class PyTorch3DHardSilhouette(Guard):
    name = "pytorch3d_hard_silhouette"
    distribution = ("pytorch3d", "easypytorch3d")
    affected = ""  # every version
    symptom = "SoftSilhouetteShader with blur_radius=0 gives the geometry no useful gradient"
    upstream = "https://github.com/facebookresearch/pytorch3d/issues/344"
    remedy = (
        "RasterizationSettings(blur_radius=math.log(1 / 1e-4 - 1) * blend_params.sigma, "
        f"faces_per_pixel={TUTORIAL_FACES_PER_PIXEL}), as PyTorch3D's tutorials set it"
    )
    targets = (
        Target(MODULE, "MeshRenderer.forward", aliases=()),
        Target(MODULE, "MeshRendererWithFragments.forward", aliases=()),
    )

    def risky(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        shaders = sys.modules.get(SHADER_MODULE)
        torch = sys.modules["torch"]
        if shaders is None or not torch.is_grad_enabled():
            return False
        shader = getattr(instance, "shader", None)
        if not isinstance(shader, shaders.SoftSilhouetteShader):
            return False
        settings = _settings(instance, kwargs)
        blur = getattr(settings, "blur_radius", None)
        return isinstance(blur, (int, float)) and blur <= 0

    def handle(self, call: Call) -> Any:
        result = call.proceed()
        images = result[0] if isinstance(result, tuple) else result
        if not getattr(images, "requires_grad", False):
            return result  # a mask rendered for its own sake: nothing trains on it
        settings = _settings(call.instance, call.kwargs)
        sigma = _sigma(call.instance, call.kwargs)
        blur = "log(1/1e-4 - 1) * sigma" if sigma is None else f"{BLUR_PER_SIGMA * sigma:.3g}"
        fields = {
            "target": str(call.target),
            "sigma": sigma,
            "blur_radius": float(settings.blur_radius),
            "faces_per_pixel": settings.faces_per_pixel,
            "suggested_blur_radius": None if sigma is None else BLUR_PER_SIGMA * sigma,
        }
        event = (
            "a SoftSilhouetteShader silhouette rendered with blur_radius=0 received a "
            "gradient: with these settings pixels outside the mesh get no face, so the "
            "silhouette's edges give the geometry no gradient and the fit cannot move them "
            f"(sigma={sigma}, faces_per_pixel={settings.faces_per_pixel})"
        )
        remedy = (
            f"RasterizationSettings(blur_radius={blur}, faces_per_pixel="
            f"{TUTORIAL_FACES_PER_PIXEL}) (blur_radius = log(1/1e-4 - 1) * sigma, "
            "as PyTorch3D's tutorials set it)"
        )
        self._watch(images, call.callsite, event, remedy, fields)
        return result

    def _watch(
        self,
        images: torch.Tensor,
        callsite: str,
        event: str,
        remedy: str,
        fields: dict[str, Any],
    ) -> None:
        """Decide in ``backward()``: the settings hurt only where the silhouette gets a
        gradient. The hook holds the call site captured now, not the images (no cycle)."""

        def autograd_guard_hook(grad: torch.Tensor | None) -> None:
            try:
                if grad is not None and _silhouette_nonzero(grad):
                    self.report(callsite, "no_silhouette_gradient", event, remedy=remedy, **fields)
            except GuardError as strict:
                drop_own_frames(strict)  # this raise adds back one: its own
                raise strict  # autograd-guard strict: the message says why
            except Exception as exc:
                self.fail("backward", exc)

        images.register_hook(autograd_guard_hook)  # type: ignore[no-untyped-call]


def _settings(renderer: Any, kwargs: dict[str, Any]) -> Any:
    """The raster settings this render uses (``raster_settings=`` overrides the
    rasterizer's own, as ``MeshRasterizer.forward`` reads them)."""
    rasterizer = getattr(renderer, "rasterizer", None)
    return kwargs.get("raster_settings", getattr(rasterizer, "raster_settings", None))


def _sigma(renderer: Any, kwargs: dict[str, Any]) -> float | None:
    params = kwargs.get("blend_params", getattr(renderer.shader, "blend_params", None))
    sigma = getattr(params, "sigma", None)
    return float(sigma) if isinstance(sigma, (int, float)) else None


def _silhouette_nonzero(grad: torch.Tensor) -> bool:
    """Whether the silhouette (the alpha channel, last; the shader's colour channels are
    constant ones) got a nonzero gradient (one sync on an accelerator; ``count_nonzero``
    reads the strided channel 2x faster than ``any`` on the CPU); True where that cannot be
    read (under ``torch.func.vmap``): the settings may bite there."""
    try:
        return bool(grad[..., -1].count_nonzero())
    except RuntimeError:
        return True


GUARD = PyTorch3DHardSilhouette
