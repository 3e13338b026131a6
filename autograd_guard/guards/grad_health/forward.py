"""grad_health's forward watch: which modules ran in the forward passes between two steps of
an optimizer, to tell a parameter whose module ran and got no gradient (lost) from one whose
module never ran (unused). ``torch.nn.Module``'s global forward pre-hook, on for one step
only (``usage`` says when), noting each called module's own parameters.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

WATCH_CALLS = 100_000  # module calls a watch sees at most (one step's forward passes)


class ForwardWatch:
    """The parameters of the modules called while it is on (one step's forward passes)."""

    __slots__ = ("calls", "handle", "scanned", "seen", "step")

    def __init__(self, step: int, eager: Callable[[Any], Any]) -> None:
        torch = sys.modules["torch"]
        self.step = step  # the step it began after
        self.calls = 0
        self.seen: set[int] = set()  # ids of the called modules' own parameters
        self.scanned: set[int] = set()  # ids of the modules whose attributes were read
        register = torch.nn.modules.module.register_module_forward_pre_hook
        self.handle: Any = register(eager(self._called))

    def _called(self, module: Any, args: Any) -> None:
        self.calls += 1
        self.seen.update(map(id, module._parameters.values()))
        if id(module) not in self.scanned:  # once per module: a module runs many times
            self.scanned.add(id(module))
            # tensors that require grad kept as plain attributes (an ODE function's
            # constants handed to the optimizer), or in a short list, tuple or dict
            self.seen.update(id(t) for _, t in attribute_tensors(module))
        if self.calls >= WATCH_CALLS:
            self.close()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


CONTAINER_ITEMS = 64  # a list, tuple or dict attribute longer than this is not read


def attribute_tensors(module: Any) -> list[tuple[str, Any]]:
    """``module``'s own leaf tensors that require grad and are no module's parameter:
    public plain attributes (``k``) and the items of short list, tuple and dict attributes
    (``extra.0``). A ``Parameter`` is its module's, named and watched there (a list of
    another module's parameters, an RNN's ``_flat_weights``, is not this module's)."""
    torch = sys.modules["torch"]
    tensor, parameter = torch.Tensor, torch.nn.Parameter
    found = []
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue  # torch's registries and a module's private state
        if isinstance(value, dict):
            items: Any = value.items() if len(value) <= CONTAINER_ITEMS else ()
        elif isinstance(value, (list, tuple)):
            items = enumerate(value) if len(value) <= CONTAINER_ITEMS else ()
        else:
            items = (("", value),)
        for key, item in items:
            if (
                isinstance(item, tensor)
                and not isinstance(item, parameter)
                and item.requires_grad
                and item.is_leaf
            ):
                found.append((f"{name}.{key}" if key != "" else name, item))
    return found
