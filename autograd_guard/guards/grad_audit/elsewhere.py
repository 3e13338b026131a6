"""grad_audit: an input whose gradient the backward delivers somewhere else.

Symptom (a false ``wrong_gradient``): Megatron-LM's and Transformer Engine's fused
weight-gradient accumulation (``gradient_accumulation_fusion``, ``fuse_wgrad_accumulation``)
add the weight's gradient into ``weight.main_grad`` inside the backward and return a
placeholder for the weight (zeros, an empty tensor, or None) with
``weight.grad_added_to_main_grad = True``: the returned gradient differs from the
derivative by design, and the optimizer reads ``main_grad``. Any release of either.

Remedy: the tensor attributes of each tensor argument (its ``__dict__``) of the
argument's own number of elements are read just before the call's backward runs and
again after: an input one of which the backward wrote in place (an accumulator like
``main_grad``), or that holds ``main_grad`` with ``grad_added_to_main_grad`` set, has its
gradient delivered there and is not judged; its other inputs still are (where none is
left, the exit note says why the call was not audited). Other attributes a backward sets
or replaces (a counter, a cached transpose, a statistic a user's hook keeps) are not
taken for a gradient. A write through a raw pointer that moves no version counter is not
seen (the flag covers Megatron's and Transformer Engine's fused kernels).
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
    """The accumulator-like attributes of one call's tensor arguments (by their index
    among the tensor arguments, torch's order), as the backward found and left them."""

    __slots__ = ("_attributes", "_before")

    def __init__(self, tensors: list[Any]) -> None:
        # the dicts and sizes, not the tensors: an input the graph does not save is not
        # kept alive
        self._attributes = {
            index: (attributes, tensor.numel())
            for index, tensor in enumerate(tensors)
            if (attributes := getattr(tensor, "__dict__", None)) is not None
        }
        self._before: dict[int, dict[str, int]] | None = None  # None: the backward not begun

    def before(self) -> None:
        """Just before the backward runs."""
        self._before = {index: _versions(*kept) for index, kept in self._attributes.items()}

    def changed(self) -> dict[int, list[str]]:
        """After the backward ran: the inputs whose gradient went to an attribute, and
        the attributes' names."""
        found: dict[int, list[str]] = {}
        if self._before is None:
            return found
        for index, (attributes, size) in self._attributes.items():
            then = self._before.get(index, {})
            now = _versions(attributes, size)
            names = {name for name, version in now.items() if then.get(name, version) != version}
            if attributes.get(ADDED) is True and "main_grad" in attributes:
                names.add(ADDED)  # set by this backward, or an earlier micro-batch's
            if names:
                found[index] = sorted(names)
        return found


def _versions(attributes: dict[str, Any], size: int) -> dict[str, int]:
    """The version counters of the tensor attributes of ``size`` elements (an inference
    tensor has none: it cannot be written by autograd's code either)."""
    tensor = sys.modules["torch"].Tensor
    found = {}
    for name, value in list(attributes.items()):
        if isinstance(value, tensor) and not value.is_inference():
            try:
                if value.numel() == size:
                    found[name] = value._version
            except RuntimeError:  # a tensor without a version counter
                continue
    return found
