"""grad_audit's watch on the real backward: the backward that training runs, not a
private re-run, judged by hooks on the call's own autograd node.

Before the node runs (a pre-hook), the incoming gradients (``grad_output``) are kept: the
tensors, their version counters and what their values were. After it ran (a hook), the
Function's backward has returned the gradients of its inputs: if it changed an incoming
gradient in place, that broke torch's contract by itself (the same tensor is handed to
every other branch that reads the output: a residual ``p + f(p)`` gets a gradient the
Function zeroed; Warp's interop adjoint launch does so, writing through a raw pointer, so
the version counter does not move: the values are compared too). The values are a copy
where the call is audited (the audit projects onto them; its inputs and outputs are
bounded by ``max_elements``) or the gradient is small; else a fingerprint computed on the
gradient's device, a block at a time (``fingerprint``): no copy of a large gradient, nor
of the whole of an expanded one. The kept gradients and the returned ones are then handed
to the finite-difference audit, if the call has one. The hooks are removed after the
first backward through the node; what was kept goes with the node (a graph never
backpropagated frees it). Torch 2.0 and newer have node pre-hooks; without them nothing
is watched.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    # (grad_inputs the backward returned, copies of the grad_outputs it was given)
    Judge = Callable[[tuple[Any, ...], list[Any]], None]

# An incoming gradient of at most COPIED elements is copied; a larger one fingerprinted in
# BLOCKS blocks, of BLOCK elements at least (its own memory: two float64 blocks, 1 MiB or
# 1.6% of a float32 gradient; its kernel launches: a few per block).
COPIED, BLOCK, BLOCKS = 1 << 16, 1 << 16, 256


def node_of(cls: type, output: Any) -> Any:
    """The autograd node of this call (``cls``'s backward class), or None."""
    torch = sys.modules["torch"]
    top = output if isinstance(output, tuple) else (output,)
    backward_cls = getattr(cls, "_backward_cls", None)
    for item in top:
        node = item.grad_fn if isinstance(item, torch.Tensor) else None
        if node is not None and backward_cls is not None and type(node) is backward_cls:
            return node
    return None


def watch(
    node: Any,
    modified: Callable[[list[int]], None],
    judge: Judge | None,
    failed: Callable[[BaseException], None],
    prepare: Callable[[], None] | None = None,
) -> bool:
    """Hook ``node``: ``prepare()`` just before it runs, ``modified(positions)`` where the
    backward changed incoming gradients in place, ``judge`` with what it returned. False
    where this torch cannot. An error of
    the hooks' own goes to ``failed`` (the backward goes on); what ``modified`` and
    ``judge`` raise (strict's ``GuardError``) comes out of ``backward()``."""
    if not hasattr(node, "register_prehook"):
        return False
    kept: list[tuple[Any, int, Any, Any] | None] = []
    handles: list[Any] = []
    copied = COPIED if judge is None else None  # the audit projects onto copies

    def before(grad_outputs: tuple[Any, ...]) -> None:
        try:
            if prepare is not None:
                prepare()
            # a meta tensor has no values to compare
            kept[:] = [_keep(g, copied) if _valued(g) else None for g in grad_outputs]
        except Exception as exc:
            kept.clear()
            failed(exc)

    def after(grad_inputs: tuple[Any, ...], grad_outputs: tuple[Any, ...]) -> None:
        try:
            for handle in handles:
                handle.remove()
            changed = [i for i, kept_one in enumerate(kept) if kept_one and _changed(*kept_one)]
            copies = [entry[2] if entry is not None else None for entry in kept]
            kept.clear()
        except Exception as exc:
            failed(exc)
            return
        if changed:
            modified(changed)
        if judge is not None and copies:
            judge(grad_inputs, copies)

    handles += [node.register_prehook(before), node.register_hook(after)]
    return True


def _valued(tensor: Any) -> bool:
    return tensor is not None and not tensor.is_meta


def _keep(tensor: Any, copied: int | None) -> tuple[Any, int, Any, Any]:
    """(the tensor, its version, a copy or None, its fingerprint or None): a copy where
    ``copied`` is None or the tensor small, or not a plain real tensor on the CPU or a
    CUDA device (MPS has no float64)."""
    torch = sys.modules["torch"]
    plain = tensor.layout == torch.strided and tensor.is_floating_point()
    plain = plain and tensor.device.type in ("cpu", "cuda")
    if copied is None or tensor.numel() <= copied or not plain or type(tensor) is not torch.Tensor:
        return tensor, tensor._version, tensor.detach().clone(), None
    return tensor, tensor._version, None, fingerprint(tensor)


def _changed(tensor: Any, version: int, copy: Any, before: Any) -> bool:
    if tensor._version != version:
        return True
    torch = sys.modules["torch"]
    if copy is None:
        copy, tensor = before, fingerprint(tensor)
    same = (tensor == copy) | (torch.isnan(tensor) & torch.isnan(copy))
    return not bool(same.all())


def fingerprint(tensor: Any) -> Any:
    """Three float64 sums of the values, on their device: plain, squared, and weighted by
    position (row-major), NaN and infinities counted as finite stand-ins. A write that
    keeps all three is contrived (zeroing, scaling, one changed element, a swap all show);
    the sums are computed the same way before and after, so they agree bit for bit
    where nothing changed."""
    torch = sys.modules["torch"]
    total = torch.zeros(3, dtype=torch.float64, device=tensor.device)
    size = max(BLOCK, tensor.numel() // BLOCKS)
    for offset, block in _blocks(tensor.detach(), 0, size):
        values = block.to(torch.float64, copy=True).reshape(-1)  # two blocks held, in place
        values.nan_to_num_(nan=0.5, posinf=2.0, neginf=-2.0)
        end = offset + values.numel()
        where = torch.arange(offset, end, dtype=torch.float64, device=values.device)
        plain, weighted = values.sum(), where.mul_(values).sum()
        total += torch.stack([plain, values.mul_(values).sum(), weighted])
    return total


def _blocks(tensor: Any, offset: int, size: int) -> Iterator[tuple[int, Any]]:
    """(row-major offset of its first element, a view) covering ``tensor`` in views of at
    most ``size`` elements (a row larger is split itself)."""
    if tensor.dim() == 0 or tensor.numel() <= size:
        yield offset, tensor
        return
    row = tensor[0].numel()
    if row > size:
        for index in range(tensor.shape[0]):
            yield from _blocks(tensor[index], offset + index * row, size)
        return
    rows = size // row
    for start in range(0, tensor.shape[0], rows):
        yield offset + start * row, tensor[start : start + rows]


def modified_event(op: str, positions: list[int]) -> str:
    which = ", ".join(str(p) for p in positions)
    return (
        f"{op}'s backward changed its incoming gradient (grad_output {which}) in place: "
        "torch hands the same tensor to every other use of the output, so a branch beside "
        "the call (a residual p + f(p)) gets a wrong gradient, silently"
    )


MODIFIED_REMEDY = (
    "write the backward's result into a new tensor, or pass the backward a copy "
    "(grad_output.clone(); for Warp interop: wp.from_torch(grad_output.clone()))"
)
