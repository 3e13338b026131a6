"""The backward nodes that repair recomputes rather than masks: nodes that sum over a
forward value the loss left out. Where the loss is finite, every non-finite forward value
has a zero cotangent (the loss would be non-finite had it used one), so its true share of
any sum is 0; but the node's own backward multiplies that 0 by the saved NaN and mixes the
NaN into every finite value of the sum (a weight's gradient over a batch of rows). These
nodes' gradients are computed again from their saved values with the non-finite ones as 0
(and, for a LayerNorm, a non-finite row's statistics as 0 and 1): exactly the gradient of
the same program with those rows dropped, which is what a finite fill or a row dropped
before the op gives.

- matrix products (``mm``, ``bmm``, ``addmm``: ``nn.Linear`` over a batch of rows, the
  attention's products);
- ``native_layer_norm`` (``nn.LayerNorm``, a transformer layer's norms, either
  ``norm_first``);
- ``mul`` with broadcasting (``x * rsqrt(mean(x**2))``, RMSNorm as torch composes it, a
  weight shared by every row);
- ``scaled_dot_product_attention``'s fused CPU kernels (torch 2.2 to 2.4 make a fully
  masked row NaN there; ``nn.MultiheadAttention`` with ``need_weights=False`` and
  ``nn.TransformerEncoderLayer`` call it; torch 2.1's unmasked CPU flash attention, a
  cross-attention whose query holds such a row): recomputed by its definition with the
  saved non-finite rows as 0 and a fully masked row's weights as 0, without dropout only.
  The CUDA kernels' nodes are not.

Each returns the node's gradients, where the gate (the loss is finite) allows it; the
caller then masks what is still non-finite.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    # whether it applies to a node and its gradients; the gradients recomputed
    Recompute = tuple[Callable[[Any, Any], bool], Callable[[Any, Any, Any, Any], Any]]

# a matrix product: its saved operands' names and where their gradients begin (addmm's
# first is its bias's)
PRODUCTS = {
    "BmmBackward0": ("_saved_self", "_saved_mat2", 0),
    "MmBackward0": ("_saved_self", "_saved_mat2", 0),
    "AddmmBackward0": ("_saved_mat1", "_saved_mat2", 1),
}


def recomputes(node: Any, grads: Any) -> bool:
    """Whether ``node``'s gradients (``grads``) are recomputed, rather than masked, when
    its forward values were non-finite."""
    how = RECOMPUTED.get(type(node).__name__)
    return how is not None and how[0](node, tuple(grads))


def recompute(torch: Any, node: Any, grads: Any, grad: Any, gate: Any) -> tuple[Any, Any]:
    """``node``'s gradients (``grads``, a tuple) recomputed where it is one of these nodes
    and its incoming gradient ``grad`` is known, else ``grads`` as they are; and a flag on
    the device, whether the recomputing changed a non-finite value (None where none ran)."""
    how = RECOMPUTED.get(type(node).__name__)
    if how is None or grad is None or not how[0](node, tuple(grads)):
        return grads, None
    found = how[1](torch, node, tuple(grads), zeroed(torch, grad))
    if found is None:
        return grads, None
    olds = [old for old in grads if old is not None and old.is_floating_point()]
    changed = torch.stack([~old.isfinite().all() for old in olds]).any() if olds else None
    if changed is not None and gate is not None:
        changed = changed & gate
    new = tuple(
        old if new is None or old is None else _gated(torch, gate, new.to(old.dtype), old)
        for new, old in zip(found, grads, strict=True)
    )
    return new, changed


def zeroed(torch: Any, tensor: Any) -> Any:
    """``tensor`` with its non-finite values as 0; None where it holds no floating values."""
    if tensor is None or not tensor.is_floating_point():
        return None
    return torch.nan_to_num(tensor.detach(), nan=0.0, posinf=0.0, neginf=0.0)


def _gated(torch: Any, gate: Any, new: Any, old: Any) -> Any:
    return new if gate is None else torch.where(gate, new, old)


def _product(name: str) -> Recompute:
    first, second, at = PRODUCTS[name]

    def can(node: Any, grads: Any) -> bool:
        return len(grads) == at + 2

    def product(torch: Any, node: Any, grads: Any, grad: Any) -> Any:
        a, b = (zeroed(torch, getattr(node, saved, None)) for saved in (first, second))
        alpha = getattr(node, "_saved_alpha", 1)
        if alpha != 1:
            grad = grad * alpha
        found: list[Any] = [None] * len(grads)
        if grads[at] is not None and b is not None:
            found[at] = grad @ b.transpose(-1, -2)
        if grads[at + 1] is not None and a is not None:
            found[at + 1] = a.transpose(-1, -2) @ grad
        return found

    return can, product


def _layer_norm(torch: Any, node: Any, grads: Any, grad: Any) -> Any:
    """``native_layer_norm``'s backward with a non-finite row's input as 0, its mean 0 and
    its reciprocal deviation 1 (its cotangent is 0: the row adds nothing anywhere)."""
    x = zeroed(torch, node._saved_input)
    mean, rstd = node._saved_result1, node._saved_result2
    mean = torch.where(mean.isfinite(), mean, torch.zeros_like(mean))
    rstd = torch.where(rstd.isfinite(), rstd, torch.ones_like(rstd))
    mask = [g is not None for g in grads]
    weight, bias = node._saved_weight, node._saved_bias
    return torch.ops.aten.native_layer_norm_backward(
        grad, x, list(node._saved_normalized_shape), mean, rstd, weight, bias, mask
    )


def _broadcast(node: Any, grads: Any) -> bool:
    """A product of two saved floating tensors of different shapes (equal shapes are
    masked as they are)."""
    a, b = (_saved(node, name) for name in ("_saved_self", "_saved_other"))
    if len(grads) != 2 or a is None or b is None:
        return False
    return bool(a.is_floating_point() and b.is_floating_point() and a.shape != b.shape)


def _saved(node: Any, name: str) -> Any:
    try:
        return getattr(node, name, None)
    except Exception:  # freed
        return None


def _mul(torch: Any, node: Any, grads: Any, grad: Any) -> Any:
    """A broadcasting product's gradients, each summed back to its operand's shape, with
    the saved non-finite values as 0."""
    a, b = zeroed(torch, node._saved_self), zeroed(torch, node._saved_other)
    found = [None, None]
    if grads[0] is not None:
        found[0] = (grad * b).sum_to_size(grads[0].shape)
    if grads[1] is not None:
        found[1] = (grad * a).sum_to_size(grads[1].shape)
    return found


def _attention_plain(node: Any, grads: Any) -> bool:
    """A fused attention on the CPU, without dropout, with as many key as query heads,
    whose mask (if any) takes no gradient."""
    query, key = _saved(node, "_saved_query"), _saved(node, "_saved_key")
    if len(grads) != 3 or query is None or key is None or query.dim() < 2:
        return False
    if query.device.type != "cpu" or not query.is_floating_point():
        return False
    return not _saved(node, "_saved_dropout_p") and query.shape[:-2] == key.shape[:-2]


def _attention(torch: Any, node: Any, grads: Any, grad: Any) -> Any:
    """softmax(q k^T * scale + mask) v's gradients from the saved inputs, written out (no
    backward pass of its own), with a row that the masks mask fully given weights 0 (its
    cotangent is 0)."""
    # a NaN row of the query (a cross-attention over a fully masked row) or of a key the
    # masks leave out: 0, as the loss's 0 cotangent makes its share
    q, k, v = (zeroed(torch, t) for t in (node._saved_query, node._saved_key, node._saved_value))
    mask, causal = _saved(node, "_saved_attn_mask"), _saved(node, "_saved_is_causal")
    scale = _saved(node, "_saved_scale") or q.shape[-1] ** -0.5
    scores = (q @ k.transpose(-2, -1)) * scale
    if mask is not None and mask.is_floating_point():
        scores = scores + mask.detach()
    elif mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if causal:
        kept = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~kept, float("-inf"))
    live = scores.isfinite().any(-1, keepdim=True)
    weights = torch.softmax(torch.where(live, scores, torch.zeros_like(scores)), -1) * live
    grad = grad.to(weights.dtype)
    d_weights = grad @ v.transpose(-2, -1)
    d_scores = weights * (d_weights - (d_weights * weights).sum(-1, keepdim=True)) * scale
    found = (d_scores @ k, d_scores.transpose(-2, -1) @ q, weights.transpose(-2, -1) @ grad)
    return [new if old is not None else None for new, old in zip(found, grads, strict=True)]


RECOMPUTED: dict[str, Recompute] = {
    **{name: _product(name) for name in PRODUCTS},
    "NativeLayerNormBackward0": ((lambda node, grads: len(grads) == 3), _layer_norm),
    "MulBackward0": (_broadcast, _mul),
    "ScaledDotProductFlashAttentionForCpuBackward0": (_attention_plain, _attention),
    # torch 2.1's CPU flash attention (no mask) is named as CUDA's: recomputed on the CPU only
    "ScaledDotProductFlashAttentionBackward0": (_attention_plain, _attention),
}
