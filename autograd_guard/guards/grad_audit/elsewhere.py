"""grad_audit: an input whose gradient the backward delivers somewhere else.

Symptom (a false ``wrong_gradient``): Megatron-LM's and Transformer Engine's fused
weight-gradient accumulation (``gradient_accumulation_fusion``, ``fuse_wgrad_accumulation``)
add the weight's gradient into ``weight.main_grad`` inside the backward and return a
placeholder for the weight (zeros, an empty tensor, or None) with
``weight.grad_added_to_main_grad = True``: the returned gradient differs from the
derivative by design, and the optimizer reads ``main_grad``. Any release of either.

Remedy: the attributes of each tensor argument (its ``__dict__``: ``main_grad``, flags)
are read just before the call's backward runs and again after: an input one of whose
tensor attributes the backward wrote in place, or whose attributes it set, replaced or
removed, or that holds ``main_grad`` with ``grad_added_to_main_grad`` set, has its
gradient delivered there and is not judged; its other inputs still are
(where none is left, the exit note says why the call was not audited). A write through
a raw pointer that leaves both the version counter and every attribute as they were is
not seen.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


# Megatron's and Transformer Engine's flag: the weight's gradient is in ``main_grad``. Reset
# once per iteration (``zero_grad_buffer``), so a later micro-batch's backward finds it set
# and sets it again: no change to see, the flag itself says so.
ADDED = "grad_added_to_main_grad"


class Elsewhere:
    """The attributes of one call's tensor arguments (by their index among the tensor
    arguments, torch's order), as the backward found and left them."""

    __slots__ = ("_attributes", "_before")

    def __init__(self, tensors: list[Any]) -> None:
        # the dicts, not the tensors: an input the graph does not save is not kept alive
        self._attributes = {
            index: attributes
            for index, tensor in enumerate(tensors)
            if (attributes := getattr(tensor, "__dict__", None)) is not None
        }
        self._before: dict[int, tuple[Any, ...]] | None = None  # None: the backward not begun

    def before(self) -> None:
        """Just before the backward runs."""
        self._before = {index: _state(d) for index, d in self._attributes.items()}

    def changed(self) -> dict[int, list[str]]:
        """After the backward ran: the inputs whose attributes it wrote, and their names."""
        found: dict[int, list[str]] = {}
        if self._before is None:
            return found
        for index, attributes in self._attributes.items():
            then = dict((name, rest) for name, *rest in self._before.get(index, ()))
            now = dict((name, rest) for name, *rest in _state(attributes))
            names = {n for n in then.keys() | now.keys() if then.get(n) != now.get(n)}
            if attributes.get(ADDED) is True and "main_grad" in attributes:
                names.add(ADDED)  # set already by an earlier micro-batch's backward
            if names:
                found[index] = sorted(names)
        return found


def _state(attributes: dict[str, Any]) -> tuple[tuple[Any, ...], ...]:
    """Each attribute's name, the object held, and a tensor's version counter."""
    tensor = sys.modules["torch"].Tensor
    return tuple(
        (name, id(value), value._version if isinstance(value, tensor) else None)
        for name, value in list(attributes.items())
    )
