"""grad_audit's watch on the real backward: the backward that training runs, not a
private re-run, judged by hooks on the call's own autograd node.

Before the node runs (a pre-hook), the incoming gradients (``grad_output``) are kept: the
tensors, their version counters and a copy of their values. After it ran (a hook), the
Function's backward has returned the gradients of its inputs: if it changed an incoming
gradient in place, that broke torch's contract by itself (the same tensor is handed to
every other branch that reads the output: a residual ``p + f(p)`` gets a gradient the
Function zeroed; Warp's interop adjoint launch does so, writing through a raw pointer, so
the version counter does not move: the values are compared too). The kept gradients and
the returned ones are then handed to the finite-difference audit, if the call has one.
The hooks are removed after the first backward through the node; the kept copies go with
the node (a graph never backpropagated frees them). Torch 2.0 and newer have node
pre-hooks; without them nothing is watched.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    # (grad_inputs the backward returned, copies of the grad_outputs it was given)
    Judge = Callable[[tuple[Any, ...], list[Any]], None]


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
) -> bool:
    """Hook ``node``: ``modified(positions)`` where the backward changed incoming gradients
    in place, ``judge`` with what it returned. False where this torch cannot. An error of
    the hooks' own goes to ``failed`` (the backward goes on); what ``modified`` and
    ``judge`` raise (strict's ``GuardError``) comes out of ``backward()``."""
    if not hasattr(node, "register_prehook"):
        return False
    kept: list[tuple[Any, int, Any] | None] = []
    handles: list[Any] = []

    def before(grad_outputs: tuple[Any, ...]) -> None:
        try:
            kept[:] = [
                (g, g._version, g.detach().clone()) if g is not None else None for g in grad_outputs
            ]
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


def _changed(tensor: Any, version: int, copy: Any) -> bool:
    if tensor._version != version:
        return True
    torch = sys.modules["torch"]
    same = (tensor == copy) | (torch.isnan(tensor) & torch.isnan(copy))
    return not bool(same.all())


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
