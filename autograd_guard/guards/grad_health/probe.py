"""grad_health's localiser: after a non-finite step, a short-lived probe that names the
backward op which first produced the non-finite value and the forward line that ran it.

It costs nothing until it is armed. Armed, it turns on anomaly mode with
``check_nan=False`` (forward tracebacks are kept in each node's metadata, nothing raises)
and, for each ``torch.autograd.backward`` or ``torch.autograd.grad`` pass, hooks every node
of the graph to sum what it returns (kept on the device, read with one sync per device
after the pass). It disarms after a few passes, a few optimizer steps or some seconds,
whichever comes first (a timer covers a program that stops stepping), and puts back what it
changed: the two functions, only if they are still its own, and anomaly mode, only if it is
still as the probe set it.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time

from autograd_guard.guards.grad_health.check import gradient_sum

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_OWN = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
SECONDS = 30.0  # the longest a probe stays armed


class BackwardProbe:
    """Records up to ``passes`` backward passes, over at most ``steps`` optimizer steps."""

    def __init__(self, passes: int, steps: int, eager: Callable[[Any], Any]) -> None:
        self.passes, self.steps = passes, steps
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

    def arm(self) -> None:
        torch = sys.modules["torch"]
        with self._lock:
            self._anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
            torch.autograd.set_detect_anomaly(True, check_nan=False)
            for name in ("backward", "grad"):
                self._originals[name] = getattr(torch.autograd, name)
                self._patched[name] = self._eager(self._probed(name))
                setattr(torch.autograd, name, self._patched[name])
            self.armed = True
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
            for name, original in self._originals.items():
                if getattr(torch.autograd, name) is self._patched[name]:
                    setattr(torch.autograd, name, original)
            if self._anomaly is not None and (
                torch.is_anomaly_enabled() and not torch.is_anomaly_check_nan_enabled()
            ):  # still as the probe set it: the user's setting comes back
                torch.autograd.set_detect_anomaly(*self._anomaly)
        timer = self._timer
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()

    def step_done(self) -> bool:
        """An optimizer step is over; True once the probe is done (and disarmed)."""
        self.stepped += 1
        if self._finished() or self.stepped >= self.steps:
            self.disarm()
        return not self.armed

    def _finished(self) -> bool:
        return (
            self.origin is not None
            or self.tainted
            or self.error is not None
            or self.recorded >= self.passes
            or time.monotonic() > self._deadline
        )

    def _probed(self, name: str) -> Callable[..., Any]:
        keyword = "tensors" if name == "backward" else "outputs"

        def probed(*args: Any, **kwargs: Any) -> Any:
            original = self._originals[name]
            if not self.armed or self._finished() or _in_transform():
                return original(*args, **kwargs)
            pending: list[tuple[Any, int, list[Any]]] = []  # (node, its output sums), in order
            handles = self._hook_graph(args[0] if args else kwargs.get(keyword), pending)
            try:
                return original(*args, **kwargs)
            finally:
                self._pass_done(handles, pending)

        return probed

    def _hook_graph(self, tensors: Any, pending: list[tuple[Any, int, list[Any]]]) -> list[Any]:
        """Hooks on this pass's nodes, each writing to this pass's ``pending`` (another
        thread's pass has its own; on CUDA the hooks run in autograd's device threads)."""
        torch = sys.modules["torch"]
        handles = []
        try:
            roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
            for node in _graph([t.grad_fn for t in roots if t.grad_fn is not None]):
                hook = functools.partial(self._node_hook, node, pending)
                handles.append(node.register_hook(hook))
        except Exception as exc:
            self.error = exc
        return handles

    def _pass_done(self, handles: list[Any], pending: list[tuple[Any, int, list[Any]]]) -> None:
        self.recorded += 1
        try:
            for handle in handles:
                handle.remove()
            found = _first_nonfinite(sys.modules["torch"], pending)
            if found is TAINTED:
                self.tainted = True
            elif found is not None:
                frames = _frames(found)
                self.origin = type(found).__name__, _forward_line(frames)
                self.frames = tuple((file, function) for file, _, function, _ in frames)
        except Exception as exc:
            self.error = exc

    def _check_node(
        self, node: Any, pending: list[tuple[Any, int, list[Any]]], grad_inputs: Any, _: Any
    ) -> None:
        # Nodes run in topological order: the first one whose output is not finite, all
        # of whose inputs came from nodes before it, made the value.
        if not self.armed or self.origin is not None:
            return
        torch = sys.modules["torch"]
        try:
            with torch.no_grad():
                sums = [gradient_sum(torch, _local(g)) for g in grad_inputs if g is not None]
                outputs = len(sums)
                if sums:  # what the forward op saw: a value already non-finite is no origin
                    sums += [gradient_sum(torch, _local(t)) for t in _saved_tensors(node)]
            if sums:
                pending.append((node, outputs, sums))
        except Exception as exc:
            self.error = exc


def _local(tensor: Any) -> Any:
    """A DTensor's local shard: the probe reads what this rank holds and never
    communicates (a DTensor op on one rank alone would wait on, or pair with, the others'
    collectives)."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def _in_transform() -> bool:
    """A ``torch.func`` transform (vmap, grad, jacrev) runs this pass: its tensors are
    wrapped per level and cannot be read outside it, so the probe steps aside."""
    functorch = getattr(sys.modules["torch"]._C, "_functorch", None)
    peek = getattr(functorch, "peek_interpreter_stack", None)
    try:
        return peek is not None and peek() is not None
    except Exception:
        return True


TAINTED = object()  # the first non-finite output came of non-finite forward values


def _saved_tensors(node: Any) -> list[Any]:
    """The floating-point tensors a backward node saved from its forward op."""
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
                found.append(item)
    return found


_SAVED: dict[type, list[str]] = {}


def _first_nonfinite(torch: Any, pending: list[tuple[Any, int, list[Any]]]) -> Any:
    """The first node in ``pending`` with a non-finite output from finite forward values
    (``TAINTED`` when the first such output came of non-finite ones), read with one sync
    per device."""
    flat = [flag for _, _, flags in pending for flag in flags]
    by_device: dict[Any, list[int]] = {}
    for index, flag in enumerate(flat):
        by_device.setdefault(flag.device, []).append(index)
    finite = [True] * len(flat)
    for indices in by_device.values():
        values = torch.stack([flat[i].float() for i in indices]).isfinite().tolist()
        for i, value in zip(indices, values, strict=True):
            finite[i] = value
    index = 0
    for node, outputs, flags in pending:
        if not all(finite[index : index + outputs]):
            if not all(finite[index + outputs : index + len(flags)]):
                return TAINTED
            return node
        index += len(flags)
    return None


def _graph(roots: list[Any]) -> list[Any]:
    seen: set[int] = set()
    nodes, todo = [], list(roots)
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return nodes


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
