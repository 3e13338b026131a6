"""grad_health's localiser: after a non-finite step, a short-lived probe that names the
backward op which first produced the non-finite value and the forward line that ran it.

It costs nothing until it is armed. Armed, it turns on anomaly mode with
``check_nan=False`` (forward tracebacks are kept in each node's metadata, nothing raises)
and, for each ``torch.autograd.backward`` or ``torch.autograd.grad`` pass, hooks every node
of the graph to sum what it returns (kept on the device, read with one sync per device
after the pass). It disarms after a few passes, a few optimizer steps or some seconds,
whichever comes first (a timer covers a program that stops stepping), and puts back the two
functions (if still its own) and anomaly mode (if still as the probe set it).

Where fix may repair (``nonfinite_fix = "repair"``), a pass also mends each node's non-finite
outputs as it records (to 0, while the loss is finite): every node that makes them is
found in one pass; the step is still skipped until ``repair`` says otherwise.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time

from autograd_guard.guards.grad_health.check import gradient_sum
from autograd_guard.guards.grad_health.dist import local_gradient as shard_of
from autograd_guard.guards.grad_health.made import (
    LEAF,
    SPECTRAL,
    forward_maker,
    graph_nodes,
    in_transform,
    leaves_below,
    leaves_finite,
    mend_node,
    mendable,
    node_key,
    pass_roots,
    patch_autograd,
    unpatch_autograd,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    # a node, its outputs, their sums and its saved values', their names, mendable if tainted
    Pending = tuple[Any, int, list[Any], list[str], bool]

_OWN = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
SECONDS = 30.0  # the longest a probe stays armed


class BackwardProbe:
    """Records up to ``passes`` backward passes, over at most ``steps`` optimizer steps."""

    def __init__(
        self, passes: int, steps: int, eager: Callable[[Any], Any], mend: bool = False
    ) -> None:
        self.passes, self.steps = passes, steps
        self.mend = mend  # fix with repair: mend each node's output as it is recorded
        self.confirm = mend  # go on until two passes name the same node (or one names none)
        self.keys: list[tuple[Any, ...] | None] = []  # per pass: the first node's key (None: none)
        self.makers: set[tuple[Any, ...]] = set()  # every node key that made such values
        self.made: tuple[str, str] | None = None  # the forward op that made them, its line
        self.loss_finite = True  # the last pass's roots were finite
        self.mended = False  # the last pass's gradients were mended (the step is not clean)
        self.declined: str | None = None  # a node found, with a finite loss, not mendable
        self.ranks = False  # fix would repair, but the ranks of a model decide together
        self.behind: list[Any] = []  # weak refs of the parameters behind those nodes
        self.recorded = self.stepped = 0
        self.armed = False
        self.origin: tuple[str, str] | None = None  # (backward op, forward file:line)
        self.tainted = False  # a pass's forward was already non-finite (weights or inputs)
        self.frames: tuple[tuple[str, str], ...] = ()  # the origin's forward (file, function)
        self.error: Exception | None = None  # the probe's own failure, for the guard
        self._eager = eager
        self._originals: dict[str, Any] = {}  # "backward"/"grad" -> torch's function
        self._patched: dict[str, Any] = {}
        self._anomaly: tuple[bool, bool] | None = None
        self._deadline = 0.0
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._node_hook = eager(self._check_node)  # one wrapper for every node
        self._owner: threading.Thread | None = None  # whose step armed it: its passes alone
        self.loss: float | None = None  # the last pass's loss, where it found makers

    def arm(self) -> None:
        torch = sys.modules["torch"]
        with self._lock:
            self._anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
            torch.autograd.set_detect_anomaly(True, check_nan=False)
            patch_autograd(lambda n: self._eager(self._probed(n)), self._originals, self._patched)
            self.armed = True
            self._owner = threading.current_thread()
            self._deadline = time.monotonic() + SECONDS
        self._timer = threading.Timer(SECONDS, self.disarm)
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        with self._lock:
            if not self.armed:
                return
            self.armed = False
            torch = sys.modules["torch"]
            unpatch_autograd(self._originals, self._patched)
            if self._anomaly is not None and (
                torch.is_anomaly_enabled() and not torch.is_anomaly_check_nan_enabled()
            ):  # still as the probe set it: the user's setting comes back
                torch.autograd.set_detect_anomaly(*self._anomaly)
        timer = self._timer
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()

    def mine(self) -> bool:
        """This thread armed it: its passes are recorded and its steps counted (another
        thread's model, trained beside it, is none of its business)."""
        return threading.current_thread() is self._owner

    def orphaned(self) -> bool:
        """Over for good: disarmed (its timer), or the thread that armed it has ended."""
        owner = self._owner
        return not self.armed or (owner is not None and not owner.is_alive())

    def step_done(self) -> bool:
        """An optimizer step of this thread is over; True once the probe is done (and
        disarmed)."""
        self.stepped += 1
        if self._finished() or self.stepped >= self.steps:
            self.disarm()
        return not self.armed

    def confirmed(self) -> bool:
        """The same node made non-finite values in the last two passes."""
        return len(self.keys) >= 2 and self.keys[-1] is not None and self.keys[-1] == self.keys[-2]

    def _finished(self) -> bool:
        named = self.origin is not None or self.tainted
        if self.confirm and named:
            named = self.confirmed() or (bool(self.keys) and self.keys[-1] is None)
        return (
            named
            or self.error is not None
            or self.recorded >= self.passes
            or time.monotonic() > self._deadline
        )

    def _probed(self, name: str) -> Callable[..., Any]:
        keyword = "tensors" if name == "backward" else "outputs"

        def probed(*args: Any, **kwargs: Any) -> Any:
            original = self._originals[name]
            if not self.armed or self._finished() or in_transform() or not self.mine():
                return original(*args, **kwargs)
            pending: list[Pending] = []  # (node, its output sums), in order
            roots = args[0] if args else kwargs.get(keyword)
            handles, gate, loss = self._hook_graph(roots, pending)
            try:
                return original(*args, **kwargs)
            finally:
                self._pass_done(handles, pending, gate, loss)

        return probed

    def _hook_graph(self, tensors: Any, pending: list[Pending]) -> tuple[list[Any], Any, Any]:
        """Hooks on this pass's nodes, each writing to this pass's ``pending`` (on CUDA the
        hooks run in autograd's device threads); whether its roots are finite and their
        sum (on their device; None where no root is floating)."""
        torch = sys.modules["torch"]
        handles: list[Any] = []
        gate = loss = None
        try:
            values, heads = pass_roots(torch, tensors)
            with torch.no_grad():
                sums = [gradient_sum(torch, shard_of(t)) for t in values if t.is_floating_point()]
                stacked = torch.stack(sums) if sums else None
                gate = stacked.isfinite().all() if stacked is not None else None
                loss = stacked.sum() if stacked is not None else None
            for node in graph_nodes(heads):
                hook = functools.partial(self._node_hook, node, pending, gate)
                handles.append(node.register_hook(hook))
        except Exception as exc:
            self.error = exc
        return handles, gate, loss

    def _pass_done(self, handles: list[Any], pending: list[Pending], gate: Any, loss: Any) -> None:
        self.recorded += 1
        try:
            for handle in handles:
                handle.remove()
            torch = sys.modules["torch"]
            # one read: whether the roots are finite, and their sum (a repair's start)
            read = None if gate is None else torch.stack([gate.float(), loss.float()]).tolist()
            self.loss_finite = read is None or bool(read[0])
            makers, saved = _nonfinite_nodes(torch, pending)
            self.mended = self.mend and self.loss_finite and bool(makers)
            if makers and read is not None:
                self.loss = read[1]
            # a non-finite loss is a divergence, never repaired; nor a node that mixes values
            repairable = self.loss_finite and all(ok for _, _, ok in makers)
            if repairable:
                self.makers.update(node_key(node) for node, _, _ in makers)
                # torch's own weak refs: one taken to a tensor that only autograd holds
                # then comes back fixed (a plain one warns when the tensor goes)
                from torch.utils.weak import TensorWeakRef

                self.behind = [TensorWeakRef(p) for p in leaves_below([n for n, _, _ in makers])]
            self.keys.append(node_key(makers[0][0]) if makers and repairable else None)
            if makers and self.loss_finite and not repairable and self.declined is None:
                self.declined = type(next(n for n, _, ok in makers if not ok)).__name__
            elif makers and repairable:
                self.declined = None  # a later pass found a node it can mend
            if not makers:
                return
            found, tainted, _ = makers[0]
            frames = _frames(found)
            self.frames = tuple((file, function) for file, _, function, _ in frames)
            if tainted:  # the forward pass held the value already: which op made it
                self.tainted = True
                maker = forward_maker(found, lambda node: saved.get(id(node), {}))
                if not leaves_finite(torch, found):  # the weights came in non-finite
                    maker = (LEAF, found)
                if maker is not None:
                    self.made = (maker[0], _forward_line(_frames(maker[1])))
            self.origin = type(found).__name__, _forward_line(frames)
        except Exception as exc:
            self.error = exc

    def _check_node(
        self, node: Any, pending: list[Pending], gate: Any, grad_inputs: Any, grad_outputs: Any
    ) -> Any:
        # Nodes run in topological order: the first one whose output is not finite, all
        # of whose inputs came from nodes before it, made the value.
        if not self.armed or (self.origin is not None and not self.confirm):
            return None
        torch = sys.modules["torch"]
        try:
            with torch.no_grad():
                sums = [gradient_sum(torch, shard_of(g)) for g in grad_inputs if g is not None]
                outputs = len(sums)
                saved = _saved_tensors(node) if sums else []
                # what the forward op saw: a value already non-finite is no origin
                sums += [gradient_sum(torch, shard_of(t)) for _, t in saved]
            if sums:
                local = mendable(node, True, grad_inputs, grad_outputs)  # if it was tainted
                pending.append((node, outputs, sums, [name for name, _ in saved], local))
            if self.mend:  # later nodes see finite values: each maker is found in one pass
                return mend_node(torch, node, grad_inputs, grad_outputs, gate)[0]
        except Exception as exc:
            self.error = exc
        return None


def _saved_tensors(node: Any) -> list[tuple[str, Any]]:
    """The floating-point tensors a backward node saved from its forward op, by name."""
    names = _SAVED.get(type(node))
    if names is None:
        names = _SAVED[type(node)] = [n for n in dir(type(node)) if n.startswith("_saved_")]
    torch = sys.modules["torch"]
    found = []
    for name in names:
        try:
            value = getattr(node, name)
        except Exception:  # freed, or not readable for this node
            continue
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, torch.Tensor) and (item.is_floating_point() or item.is_complex()):
                found.append((name, item))
    return found


_SAVED: dict[type, list[str]] = {}


def _nonfinite_nodes(
    torch: Any, pending: list[Pending]
) -> tuple[list[tuple[Any, bool, bool]], dict[int, dict[str, bool]]]:
    """The nodes in ``pending`` with a non-finite output, in order, each with whether its
    forward values were already non-finite (tainted) and whether it can be mended; and
    each node's saved values, by name, finite or not (by ``id``). One sync per device."""
    flat = [flag for _, _, flags, _, _ in pending for flag in flags]
    by_device: dict[Any, list[int]] = {}
    for index, flag in enumerate(flat):
        by_device.setdefault(flag.device, []).append(index)
    finite = [True] * len(flat)
    for indices in by_device.values():
        values = torch.stack([flat[i].float() for i in indices]).isfinite().tolist()
        for i, value in zip(indices, values, strict=True):
            finite[i] = value
    index, found, saved = 0, [], {}
    for node, outputs, flags, names, local in pending:
        values = finite[index + outputs : index + len(flags)]
        saved[id(node)] = dict(zip(names, values, strict=True))
        if not all(finite[index : index + outputs]):
            mends = (local or all(values)) and type(node).__name__ not in SPECTRAL
            found.append((node, not all(values), mends))
        index += len(flags)
    return found, saved


def _frames(node: Any) -> list[tuple[str, str, str, str]]:
    """The forward stack that made ``node`` (anomaly mode's traceback), outermost first:
    (file, line, function, the first line of code)."""
    entries = node.metadata.get("traceback_", []) if hasattr(node, "metadata") else []
    frames = []
    for entry in entries:
        text = entry.strip()
        if text.startswith('File "'):
            filename, _, rest = text[6:].partition('", line ')
            head, _, code = rest.partition("\n")
            line, _, function = head.partition(", in ")
            frames.append((filename, line.strip(), function.strip(), code.strip()))
    return frames


def _forward_line(frames: list[tuple[str, str, str, str]]) -> str:
    """``file:line`` of the user's code that ran the op; under torch.compile, the compiled
    function's line and the op's line in the graph."""
    torch_dir = os.path.dirname(sys.modules["torch"].__file__ or "") + os.sep
    graph_line = ""
    for filename, line, _, code in reversed(frames):
        if filename.startswith("<eval_with_key>"):  # code generated by torch.compile
            graph_line = graph_line or code.split(";")[0].strip()
            continue
        if filename.startswith((torch_dir, _OWN)):
            continue
        place = f"{os.path.normpath(filename)}:{line}"
        return f"{place} (in a torch.compile graph: {graph_line})" if graph_line else place
    return "<unknown>"
