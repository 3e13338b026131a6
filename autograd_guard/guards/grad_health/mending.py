"""The mechanics of grad_health's repair (``repair``): in every backward pass, the
non-finite outputs of the nodes it knows become 0, on the device, with no host read; per
pass, one value (the loss where a value was changed, NaN where none was) read once it is
ready, never by waiting for it.
"""

from __future__ import annotations

import collections
import functools
import sys
import threading

from autograd_guard.guards.grad_health.check import PendingFlag, gradient_sum
from autograd_guard.guards.grad_health.dist import local_gradient as local
from autograd_guard.guards.grad_health.made import (
    graph_nodes,
    in_transform,
    mend_node,
    node_key,
    patch_autograd,
    unpatch_autograd,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

FALL = 1e-3  # the least relative fall of the loss that counts as training
LOSS = "the loss has not fallen"
STUCK = "the parameters behind it have not moved"
REST = 20  # passes in a row that changed nothing, after which the repair stands down
RISING = 0.7  # the trend of a rising loss (Kendall's tau; flat noise: ~1e-5 to reach it)
WINDOW = 12  # the fewest mended passes that trend is judged on


class _Pass:
    __slots__ = ("flags", "gate")

    def __init__(self, gate: Any) -> None:
        self.gate = gate  # the loss is finite (a flag on its device)
        self.flags: list[Any] = []  # per mended output: a value was changed


class Repairer:
    """Mends, in every backward pass, the non-finite outputs of the nodes it knows."""

    def __init__(self, eager: Callable[[Any], Any]) -> None:
        self.keys: set[tuple[Any, ...]] = set()
        self.pending: collections.deque[PendingFlag] = collections.deque()
        self.passes = self.repaired = 0  # backward passes seen, and those mended
        self.quiet = 0  # passes in a row that changed nothing
        self.first: float | None = None  # the loss of the first mended pass
        self.best: float | None = None
        self.judged = False  # the stall check has been made
        # the losses of the latest mended passes in a row above the first's (see ``worse``)
        self.above: list[float] = []
        self.worse_said = False
        self.site = "-"  # the step where repair began
        self.behind: list[tuple[Any, Any]] = []  # (weak ref of a parameter, its sum then)
        self.armed = False
        self._eager = eager
        self._originals: dict[str, Any] = {}
        self._patched: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._hook = eager(self._mend)

    def arm(self) -> None:
        with self._lock:
            if self.armed:
                return
            patch_autograd(
                lambda n: self._eager(self._repairing(n)), self._originals, self._patched
            )
            self.armed = True

    def disarm(self) -> None:
        with self._lock:
            if not self.armed:
                return
            self.armed = False
            unpatch_autograd(self._originals, self._patched)

    def _repairing(self, name: str) -> Callable[..., Any]:
        keyword = "tensors" if name == "backward" else "outputs"

        def repairing(*args: Any, **kwargs: Any) -> Any:
            original = self._originals[name]
            if not self.armed or in_transform():
                return original(*args, **kwargs)
            roots = args[0] if args else kwargs.get(keyword)
            handles, state, loss = self._hook_graph(roots)
            try:
                return original(*args, **kwargs)
            finally:
                self._pass_done(handles, state, loss)

        return repairing

    def _hook_graph(self, tensors: Any) -> tuple[list[Any], _Pass | None, Any]:
        torch = sys.modules["torch"]
        roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
        with torch.no_grad():
            sums = [gradient_sum(torch, local(t)).float() for t in roots if t.is_floating_point()]
            loss = torch.stack(sums).sum() if sums else None
        if loss is None:
            return [], None, None
        state = _Pass(loss.isfinite())
        handles = [
            node.register_hook(functools.partial(self._hook, node, state))
            for node in graph_nodes([t.grad_fn for t in roots if t.grad_fn is not None])
            if node_key(node) in self.keys
        ]
        return handles, state, loss

    def _mend(self, node: Any, state: _Pass, grad_inputs: Any, grad_outputs: Any) -> Any:
        torch = sys.modules["torch"]
        with torch.no_grad():
            out, flags = mend_node(torch, node, grad_inputs, grad_outputs, state.gate)
        state.flags += flags
        return out

    def _pass_done(self, handles: list[Any], state: _Pass | None, loss: Any) -> None:
        for handle in handles:
            handle.remove()
        if state is None or not handles:
            return
        torch = sys.modules["torch"]
        with torch.no_grad():
            changed = torch.stack(state.flags).any() if state.flags else loss.isnan()
            # the loss where a value was changed, NaN where none was: one value to read
            value = torch.where(changed, loss, torch.full_like(loss, float("nan")))
        self.pending.append(PendingFlag(value))

    def drain(self) -> None:
        """Read the passes whose flags are ready (never waiting for one)."""
        while self.pending and self.pending[0].ready():
            value = float(self.pending.popleft().host[0].item())
            self.passes += 1
            self.quiet = self.quiet + 1 if value != value else 0
            if value == value:  # not NaN: this pass was mended
                self.repaired += 1
                self.first = value if self.first is None else self.first
                self.best = value if self.best is None else min(self.best, value)
                if value > self.first + FALL * abs(self.first):
                    self.above.append(value)
                else:
                    self.above.clear()

    def watch(self, behind: list[Any]) -> None:
        """The parameters behind the repaired nodes (weak refs), each with a sum of its
        values now (on the device), to tell later whether repair moved them."""
        torch = sys.modules["torch"]
        with torch.no_grad():
            self.behind = [(ref, p.detach().sum()) for ref in behind if (p := ref()) is not None]

    def worse(self, steps: int) -> int:
        """Once: the loss of each of the last ``max(steps, WINDOW)`` mended passes was above
        the loss where the repair began (where skipping would have kept the weights), and
        it rises through them (Kendall's tau of the losses against their order at least
        ``RISING``: a noisy but flat loss, above an unusually easy first batch, is not).
        The number of passes judged; 0 where not (or said already)."""
        count = max(steps, WINDOW)
        del self.above[:-count]  # what later checks need, no more
        if self.worse_said or not steps or len(self.above) < count:
            return 0
        window = self.above
        order = sum((b > a) - (b < a) for i, a in enumerate(window) for b in window[i + 1 :])
        self.worse_said = order >= RISING * count * (count - 1) / 2
        return count if self.worse_said else 0

    def stalled(self, steps: int) -> str | None:
        """Judged once, after ``steps`` mended passes: what has not moved (one read)."""
        if self.judged or not steps or self.repaired < steps:
            return None
        self.judged = True
        first, best = self.first or 0.0, self.best or 0.0
        if not best < first - FALL * abs(first):
            return LOSS
        params = [(ref(), then) for ref, then in self.behind]
        moved = [bool(p.detach().sum() != then) for p, then in params if p is not None]
        return STUCK if moved and not any(moved) else None
