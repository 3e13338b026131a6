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

    __slots__ = ("calls", "handle", "seen", "step")

    def __init__(self, step: int, eager: Callable[[Any], Any]) -> None:
        torch = sys.modules["torch"]
        self.step = step  # the step it began after
        self.calls = 0
        self.seen: set[int] = set()  # ids of the called modules' own parameters
        register = torch.nn.modules.module.register_module_forward_pre_hook
        self.handle: Any = register(eager(self._called))

    def _called(self, module: Any, args: Any) -> None:
        self.calls += 1
        self.seen.update(map(id, module._parameters.values()))
        if self.calls >= WATCH_CALLS:
            self.close()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
