"""Guard ``gsplat_means2d``: ``meta["means2d"].grad`` is None after backward.

Symptom: ``render_colors, render_alphas, meta = gsplat.rasterization(...)`` returns the
projected 2D means as ``meta["means2d"]``, a non-leaf tensor, so its ``.grad`` stays
None unless ``retain_grad()`` was called on that exact object before ``backward()``.
Calling it on a derived tensor (``* 1``, a slice, ``.squeeze(0)``, a clone) leaves both
grads None, and ``DefaultStrategy.step_post_backward`` without ``step_pre_backward``
fails with "'NoneType' object has no attribute 'clone'". Densification then runs on no
gradient at all.
Affected: every gsplat version whose ``rasterization`` returns ``meta`` (1.0.0 on).
Upstream: nerfstudio-project/gsplat#467.
Remedy: a pre-hook on the autograd node that made ``meta["means2d"]`` decides in
``backward()``, where it is known whether the user's code retained the gradient
(``strategy.step_pre_backward`` does): correct code is left alone and logs nothing.
Where the gradient would be lost, ``fix`` keeps it in ``.grad`` exactly as
``retain_grad()`` would: the node's pre-hooks run after the tensor's own hooks, so a
user's hook that scales the gradient is applied first (with ``absgrad=True`` gsplat's
backward sets ``.absgrad`` itself), and calls ``retain_grad()`` for the later passes (so
``retains_grad`` reads True after the first ``backward()``); it never reads ``.grad`` of a
tensor that does not retain it, which is torch's UserWarning about a non-leaf ``.grad``.
``observe`` logs, ``strict`` raises from ``backward()``.
"""

from __future__ import annotations

import sys

from autograd_guard.errors import GuardError, drop_own_frames
from autograd_guard.guard import Call, Guard, Target

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class GsplatMeans2d(Guard):
    name = "gsplat_means2d"
    distribution = "gsplat"
    affected = ">=1.0.0"
    symptom = "meta['means2d'].grad is None after backward()"
    upstream = "https://github.com/nerfstudio-project/gsplat/issues/467"
    remedy = (
        "call meta['means2d'].retain_grad() right after rasterization() "
        "(or strategy.step_pre_backward) and before backward()"
    )
    targets = (Target("gsplat.rendering", "rasterization", aliases=("gsplat:rasterization",)),)

    def risky(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and torch.is_grad_enabled()

    def handle(self, call: Call) -> Any:
        result = call.proceed()
        means2d = result[2].get("means2d") if isinstance(result[2], dict) else None
        # Not differentiable (with_ut / with_eval3d, gsplat#726): nothing to keep.
        if means2d is None or not means2d.requires_grad or means2d.is_leaf:
            return result
        from torch.utils.weak import TensorWeakRef  # a weak ref that torch can resurrect

        # Decided in backward(), where it is known whether the user's own code (such as
        # strategy.step_pre_backward) retained the gradient: correct code logs nothing.
        tensor, callsite = TensorWeakRef(means2d), call.callsite
        node, index = means2d.grad_fn, means2d.output_nr

        def autograd_guard_hook(grads: tuple[Any, ...]) -> None:
            try:
                self._in_backward(tensor(), grads[index], callsite)
            except GuardError as strict:
                drop_own_frames(strict)  # this raise adds back one: its own
                raise strict  # autograd-guard strict: the message says why

        # A pre-hook of the node that made means2d (torch 2.0 on) runs after every tensor
        # hook and after retain_grad's: it sees the gradient that retain_grad() would keep.
        node.register_prehook(autograd_guard_hook)
        return result

    def _in_backward(self, means2d: Any, grad: Any, callsite: str) -> None:
        # retain_grad()'s own hook runs before this one, so the flag says whether the
        # user's code retained the gradient before backward().
        if means2d is None or grad is None or means2d.retains_grad:
            return
        would_be_lost = (
            "meta['means2d'] gradient would be lost in backward() (retain_grad() was not "
            "called on it)"
        )
        event = {
            "strict": "meta['means2d'] gradient lost in backward(): retain_grad() was not "
            "called on it",
            "fix": would_be_lost + "; kept in .grad as retain_grad() would",
        }.get(self.mode, would_be_lost)
        if self.report(
            callsite,
            "retain_grad",
            event,
            target="gsplat.rendering:rasterization",
            shape=list(means2d.shape),
        ):
            # From now on torch's own retain_grad() hook keeps it (it runs before the
            # tensor's node, so only this pass needs the copy below). Set first, so that
            # reading ``.grad`` is not torch's "non-leaf .grad" UserWarning: the guard's
            # own warning, one the unguarded program never sees.
            means2d.retain_grad()
            _retain(means2d, grad)


def _retain(tensor: Any, grad: Any) -> None:
    """What retain_grad()'s hook does: a contiguous copy of the first gradient, then the
    sum of them (``tensor`` retains its gradient already: reading ``.grad`` is silent)."""
    if tensor.grad is not None:
        tensor.grad = tensor.grad + grad
    elif grad.is_sparse:
        tensor.grad = grad.clone()
    else:
        import torch

        tensor.grad = grad.clone(memory_format=torch.contiguous_format)


GUARD = GsplatMeans2d
