"""grad_audit's structural check: a Function called with inputs that require grad whose
outputs carry no gradient path back.

torch tracks the tensors a Function's ``forward`` returns on their own or in a tuple: a
tensor inside a list or a dict (or a tuple inside the tuple) is returned as the forward
made it. Made without grad (``torch.utils.checkpoint``'s reentrant ``forward`` runs its
function under ``no_grad``; any forward runs with grad off), it has no ``grad_fn``: the
caller trains on it and the gradient of everything upstream of the call is silently cut.
Seen with reentrant checkpointing of a function that returns a list (a wave-propagation
library's checkpointed time segments: their share of the gradient was dropped, the fit
diverged); named too where such tensors sit beside tracked outputs (``return h,
[aux_loss]``: the auxiliary loss's gradient is dropped, the rest trains). A tensor
returned in a list only to be logged is named as well: nothing at the call tells it from
a loss (return it in the tuple). Exact and cheap: one walk of the output, at the first
calls of each class.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# nested containers walked at most this deep, and this many items
DEPTH, ITEMS = 4, 1024


def inputs_requiring_grad(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The tensors torch tracks (top-level arguments) that require grad."""
    torch = sys.modules["torch"]
    found = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    return found + [v for v in kwargs.values() if isinstance(v, torch.Tensor) and v.requires_grad]


def cut_outputs(output: Any) -> tuple[int, bool, str]:
    """(how many floating-point tensors the output holds inside containers torch does not
    track, none of them requiring grad; whether they are beside outputs that carry a
    gradient path; the kind of container they are in). 0: none, or a nested tensor
    requires grad (the forward built a graph of its own). Beside tracked outputs (a
    reentrant checkpoint's ``return h, [aux_loss]``): what a loss takes from them gets no
    gradient back through the call, as when nothing is tracked. Only a call with inputs
    requiring grad, under grad mode, is asked."""
    torch = sys.modules["torch"]
    if isinstance(output, torch.Tensor):
        return 0, False, ""
    top = output if isinstance(output, tuple) else (output,)
    tracked = any(isinstance(t, torch.Tensor) and t.requires_grad for t in top)
    nested: list[Any] = []
    kinds: list[str] = []
    for item in top:
        if not isinstance(item, torch.Tensor):
            before = len(nested)
            _collect(torch, item, nested, DEPTH)
            if any(t.is_floating_point() or t.is_complex() for t in nested[before:]):
                kinds.append(type(item).__name__)
    if any(t.requires_grad for t in nested):
        return 0, tracked, ""
    count = sum(1 for t in nested if t.is_floating_point() or t.is_complex())
    if not tracked and isinstance(output, tuple):
        return count, False, "tuple of containers"
    if not tracked:
        return count, False, type(output).__name__
    kind = kinds[0] if len(set(kinds)) == 1 else "container"
    return count, True, "tuple inside the tuple" if kind == "tuple" else kind


def _collect(torch: Any, value: Any, found: list[Any], depth: int) -> None:
    if len(found) >= ITEMS or depth < 0:
        return
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value[:ITEMS]:
            _collect(torch, item, found, depth - 1)
    elif isinstance(value, dict):
        for item in list(value.values())[:ITEMS]:
            _collect(torch, item, found, depth - 1)


def cut_event(op: str, count: int, kind: str, beside: bool) -> str:
    tensors = f"{count} tensor{'s' if count != 1 else ''}"
    if beside:
        return (
            f"{op} was called with inputs that require grad and returned {tensors} inside "
            f"a {kind} beside the outputs torch tracks: torch does not track a {kind}'s "
            "tensors and none requires grad, so a loss that uses them (an auxiliary loss) "
            "gets no gradient back through this call: that part of training silently stops"
        )
    return (
        f"{op} was called with inputs that require grad, but returned its {tensors} inside "
        f"a {kind}, which torch does not track: none requires grad, so no gradient flows "
        "back through this call and everything before it silently stops training"
    )


CUT_REMEDY = (
    "return the tensors themselves or a tuple of them from the function (for "
    "torch.utils.checkpoint: return a tuple, not a list, or use use_reentrant=False)"
)
