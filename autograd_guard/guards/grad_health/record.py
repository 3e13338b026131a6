"""What grad_health keeps per optimizer: the parameters still waiting for a first
gradient (and what the forward pass did with their modules), the non-finite (and the
all-zero, and the gradient-less) steps in a row, and the step in progress.

Records are keyed by ``id(optimizer)`` and dropped when the optimizer is collected, so an
optimizer that defines ``__eq__`` (and so is unhashable) is checked like any other.
"""

from __future__ import annotations

import collections
import weakref

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from autograd_guard.guards.grad_health.check import PendingFlag
    from autograd_guard.guards.grad_health.dist import Sharing
    from autograd_guard.guards.grad_health.forward import ForwardWatch


class Record:
    """One optimizer's bookkeeping."""

    __slots__ = (
        "__weakref__",  # held weakly by its model's hooks (``skips``)
        "closure",
        "depth",
        "empty",
        "empty_judged",
        "evaluations",
        "first",
        "flag",
        "forward",
        "gone",
        "in_a_row",
        "kind",
        "known",
        "live",
        "live_until",
        "lost_shapes",
        "names",
        "no_loss",
        "pending",
        "probed",
        "ran",
        "shared_known",
        "sharing",
        "site",
        "skipped",
        "skips",
        "stale",
        "step",
        "suspect",
        "trained",
        "unknown_shapes",
        "unused_shapes",
        "waiting",
        "watch",
        "zero_in_a_row",
        "zero_params",
        "zero_step",
    )

    def __init__(self) -> None:
        self.step = 0  # optimizer steps seen
        self.known = 0  # parameters registered for the lost-gradient check
        self.waiting: dict[int, tuple[Any, int]] = {}  # id -> (parameter, its first step)
        self.trained = False  # some parameter got a gradient
        self.in_a_row = 0  # non-finite steps in a row
        self.skipped = 0  # steps skipped (fix)
        # names of waiting parameters, taken when a watch is read (their modules may be
        # gone before the optimizer); once retired, (name, shape) of those never trained:
        # whose module ran (lost), never ran (unused), or never watched (unknown: shapes)
        self.names: dict[int, str] = {}
        self.lost_shapes: list[tuple[str, tuple[int, ...]]] = []
        self.unused_shapes: list[tuple[str, tuple[int, ...]]] = []
        self.unknown_shapes: list[tuple[int, ...]] = []
        self.watch: ForwardWatch | None = None  # the modules called in one step's forward
        self.ran: set[int] | None = None  # ids of parameters whose module ran, once watched
        self.forward = False  # some module ran while watched
        self.empty = 0  # steps in a row where no parameter had a gradient
        self.empty_judged = False  # some of its parameters' modules ran, when last watched
        self.gone = False  # retired: its optimizer was collected before exit
        self.no_loss = False  # the step's closure returned no loss (a step skipped on purpose)
        self.kind = ""  # the optimizer's class name
        self.site: str | None = None  # where its first step was called from
        self.stale: list[tuple[int, int]] = []  # gradients a closure step left behind
        self.evaluations = 0  # closure evaluations in the step in progress
        self.depth = 0  # gated steps of this optimizer in progress (super().step() nests)
        self.closure: tuple[Any, int] | None = None  # the step's closure and its position
        self.flag: Any = None  # our found_inf, lent to a fused optimizer for this step
        self.pending: collections.deque[tuple[int, PendingFlag]] = collections.deque()
        self.sharing: Sharing | None = None  # the ranks that decide this step together
        self.shared_known = -1  # parameters counted when ``sharing`` was found
        self.skips: Any = None  # hooks that tell a step this rank left (skips)
        self.first: Any = None  # the handle of its first step's first pre-hook, till then
        self.live = -1  # the gradient probed for a value other than zero (grad_health.zero)
        self.live_until = -1  # the step from which the smallest one is probed again
        self.zero_in_a_row = 0  # steps in a row whose every gradient was exactly zero
        self.zero_step = -1  # the last step counted for that streak
        # each first step's parameters and their gradients' largest magnitudes, on the
        # device, until the zero-parameter window's end (grad_health.zero_params)
        self.zero_params: list[tuple[list[Any], Any]] | None = []
        self.suspect = False  # a probe read late said zero: read every gradient at once
        # the gradients a probe left on the device was made for, and their versions: the
        # step's end counts that step only if they are the same (grad_health.zero)
        self.probed: tuple[list[Any], list[int]] | None = None

    def lost(self, params: list[Any], window: int) -> list[Any]:
        """Parameters that got no gradient for ``window`` steps while others did (each
        once). Cheap once every parameter has had a gradient."""
        if len(params) != self.known:  # the first step, or add_param_group
            self._register(params)
        if not self.waiting:
            return []
        waiting, due = {}, []
        for key, (param, first) in self.waiting.items():
            if param.grad is not None:
                self.trained = True
            elif self.step - first + 1 >= window:
                due.append(param)
            else:
                waiting[key] = (param, first)
        self.waiting = waiting
        return due if self.trained else []

    def _register(self, params: list[Any]) -> None:
        for param in params[self.known :]:  # groups are only ever appended
            if param.requires_grad:
                self.waiting[id(param)] = (param, self.step)
        self.known = len(params)

    def never_trained(self, floor: int = 3) -> list[Any]:
        """At exit: parameters that got no gradient in all of at least ``floor`` steps of
        theirs, while others did (a run shorter than the lost-gradient window)."""
        if not self.trained:
            return []
        return [
            param
            for param, first in self.waiting.values()
            if param.grad is None and self.step - first + 1 >= floor
        ]

    def retire(self) -> None:
        """Its optimizer is gone (its parameters, and their modules, may be gone before
        it): what is said of them at exit is taken now, as names and shapes, holding no
        tensor. Whether their modules ran was read when its watch was (``usage.read``),
        or is read now from a watch that saw a forward pass; nothing is imported (this
        may run while the interpreter shuts down)."""
        watch = self.watch
        if watch is not None:
            watch.close()
            self.watch = None
            if watch.calls:  # forward passes since its last step
                self.ran, self.forward = watch.seen, True
        ran, never = self.ran, self.never_trained()
        if ran is None:
            self.unknown_shapes = [tuple(p.shape) for p in never]
        else:
            names = self.names
            self.lost_shapes = [
                (names.get(id(p), f"<a parameter of shape {tuple(p.shape)}>"), tuple(p.shape))
                for p in never
                if id(p) in ran
            ]
            quiet = [p for p in never if id(p) not in ran]
            self.unused_shapes = [
                (names[id(p)], tuple(p.shape)) for p in quiet if id(p) in names
            ]  # outside any module: unknown, as usage.sort() says
            self.unknown_shapes = [tuple(p.shape) for p in quiet if id(p) not in names]
        self.gone = True
        self.waiting, self.names = {}, {}
        self.pending.clear()
        if self.sharing is not None:
            self.sharing.release()
        self.sharing = None

    def nonfinite(self, stall_steps: int) -> bool:
        """Count a non-finite step; True when the run has just stalled, and again each
        time the stall's length doubles (a bounded rate)."""
        self.in_a_row += 1
        self.zero_in_a_row = 0  # a non-finite step is not a zero one
        n = self.in_a_row
        return (
            bool(stall_steps)
            and n >= stall_steps
            and n % stall_steps == 0
            and ((n // stall_steps) & (n // stall_steps - 1) == 0)
        )


class Records:
    """Records by optimizer identity, each dropped with its optimizer."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Any, Record]] = {}
        self.retired: list[Record] = []  # of optimizers collected before exit
        self.steps = 0  # optimizer steps seen, of every optimizer (the run's last line)
        self.over = False  # the run's last word was said: an optimizer dropped says nothing

    def get(self, optimizer: Any) -> Record:
        key = id(optimizer)
        entry = self._by_id.get(key)
        if entry is not None and entry[0]() is optimizer:
            return entry[1]
        record = Record()
        try:
            ref: Any = weakref.ref(optimizer, self._dropper(key))
        except TypeError:  # no weak references (__slots__): kept for the run
            ref = _Strong(optimizer)
        self._by_id[key] = (ref, record)
        return record

    def _dropper(self, key: int) -> Any:
        def drop(_: Any) -> None:
            """Never raises nor prints: it may run while the interpreter shuts down, where
            nothing is said of it any more (``over``)."""
            try:
                entry = self._by_id.pop(key, None)
                if self.over or entry is None:
                    return
                record = entry[1]
                if record.skipped or record.waiting or record.watch:
                    record.retire()
                    self.retired.append(record)  # what is said of it at exit
            except Exception:  # a finalizer: nothing may escape it
                pass

        return drop

    def find(self, optimizer: Any) -> Record | None:
        entry = self._by_id.get(id(optimizer))
        return entry[1] if entry is not None and entry[0]() is optimizer else None

    def all(self) -> list[Record]:
        """The records of live optimizers, then those of optimizers collected already."""
        return [record for _, record in list(self._by_id.values())] + list(self.retired)


class _Strong:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self) -> Any:
        return self.value
