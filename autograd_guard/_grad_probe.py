"""Helpers of the ``grad_health`` guard: the fused finiteness check, naming parameters,
and a short-lived probe that finds the backward op which first produced a non-finite
gradient.

The probe costs nothing until it is armed (after a non-finite step). Armed, it turns on
anomaly mode with ``check_nan=False`` (forward tracebacks are recorded in each node's
metadata, nothing raises) and, for each ``backward()``, hooks every node of the graph to
look at what it returns (a float64 sum per gradient, kept on the device and read with one
sync per device after the pass); after a few passes it puts everything back.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_OWN = os.path.dirname(os.path.abspath(__file__)) + os.sep
_HOOKED = "autograd_guard_probe"  # node metadata key: the node has the probe's hook


def all_finite(grads: list[Any], flags: dict[Any, tuple[Any, Any]] | None = None) -> bool:
    """Whether every tensor in ``grads`` is finite: one fused kernel (GradScaler's
    non-finite check, with a scale of 1.0, so the values stay as they are) and one sync
    per device. ``flags`` caches the kernel's two one-element tensors per device."""
    torch = sys.modules["torch"]
    try:
        return _fused_finite(torch, grads, flags)
    except (RuntimeError, TypeError):  # several devices, sparse or complex gradients
        for found, _ in (flags or {}).values():
            found.zero_()  # a kernel stopped midway may have set it
        by_device: dict[Any, list[Any]] = {}
        for grad in grads:
            dense = grad._values() if grad.is_sparse else grad
            dense = torch.view_as_real(dense) if dense.is_complex() else dense
            by_device.setdefault(dense.device, []).append(dense)
        return all(_fused_finite(torch, group, None) for group in by_device.values())


def _fused_finite(torch: Any, grads: list[Any], flags: dict[Any, tuple[Any, Any]] | None) -> bool:
    device = grads[0].device
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return True  # no sync is allowed inside a CUDA graph capture
    pair = flags.get(device) if flags is not None else None
    if pair is None:
        pair = (torch.zeros(1, device=device), torch.ones(1, device=device))
        if flags is not None:
            flags[device] = pair
    found, one = pair  # found stays 0 between healthy steps: no zero_() per step
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, one)
    if not found.item():
        return True
    found.zero_()
    return False


def parameter_names(params: list[Any]) -> list[str]:
    """Qualified names (``backbone.0.weight``) from the modules that own the parameters,
    found by one scan of live objects (run only when something is reported)."""
    import gc

    torch = sys.modules["torch"]
    wanted = {id(p) for p in params}
    names: dict[int, str] = {}
    module_type = torch.nn.Module
    fx = sys.modules.get("torch.fx")
    generated = (fx.GraphModule,) if fx is not None else ()  # torch.compile's own graphs
    for obj in gc.get_objects():
        kind = type(obj)  # never a proxy's __class__
        if issubclass(kind, module_type) and not issubclass(kind, generated):
            for name, param in obj.named_parameters():
                name = name.replace("_orig_mod.", "")  # a torch.compile'd model's wrapper
                # the outermost module gives the longest, most telling name
                if id(param) in wanted and len(name) > len(names.get(id(param), "")):
                    names[id(param)] = name
    return [names.get(id(p), f"<unnamed {tuple(p.shape)}>") for p in params]


class BackwardProbe:
    """Records up to ``passes`` backward passes to find where a non-finite value appeared."""

    def __init__(self, passes: int) -> None:
        self.passes = passes
        self.recorded = 0
        self.armed = False
        self.origin: tuple[str, str] | None = None  # (backward op, forward file:line)
        self.error: Exception | None = None  # the probe's own failure, for the guard
        self._pending: list[tuple[Any, list[Any]]] = []  # (node, its output flags), in order
        self._backward: Any = None
        self._patched: Any = None
        self._anomaly: Any = None

    def arm(self) -> None:
        torch = sys.modules["torch"]
        self._anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
        torch.autograd.set_detect_anomaly(True, check_nan=False)
        self._backward = torch.autograd.backward
        self._patched = self._probed_backward  # one bound method, to compare by identity
        torch.autograd.backward = self._patched
        self.armed = True

    def disarm(self) -> None:
        if not self.armed:
            return
        torch = sys.modules["torch"]
        if torch.autograd.backward is self._patched:
            torch.autograd.backward = self._backward
        torch.autograd.set_detect_anomaly(*self._anomaly)
        self.armed = False

    def step_done(self) -> bool:
        """An optimizer step is over; True once the probe is done (and disarmed)."""
        if self.origin is not None or self.recorded >= self.passes or self.error is not None:
            self.disarm()
        return not self.armed

    def _probed_backward(self, tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.armed or self.origin is not None or self.recorded >= self.passes:
            return self._backward(tensors, *args, **kwargs)
        torch = sys.modules["torch"]
        roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        try:
            for node in _graph([t.grad_fn for t in roots if t.grad_fn is not None]):
                if node.metadata.get(_HOOKED) != id(self):
                    node.metadata[_HOOKED] = id(self)
                    node.register_hook(self._checker(node))
        except Exception as exc:
            self.error = exc
        try:
            return self._backward(tensors, *args, **kwargs)
        finally:
            self.recorded += 1
            pending, self._pending = self._pending, []
            try:
                self.origin = _first_nonfinite(torch, pending)
            except Exception as exc:
                self.error = exc

    def _checker(self, node: Any) -> Any:
        torch = sys.modules["torch"]

        def check(grad_inputs: Any, grad_outputs: Any) -> None:
            # Nodes run in topological order: the first one whose output is not finite,
            # all of whose inputs came from nodes before it, made the value.
            if not self.armed or self.origin is not None:
                return
            try:
                sums = [_sum(torch, g) for g in grad_inputs if g is not None]
                if sums:
                    self._pending.append((node, sums))
            except Exception as exc:
                self.error = exc

        return check


def _sum(torch: Any, grad: Any) -> Any:
    """A sum, not finite when ``grad`` is not (or, for a finite gradient, when its sum
    passes 3e38): one read of the tensor, several times cheaper than ``isfinite().all()``.
    Half precisions are summed in float32, whose range a sum of them cannot pass."""
    values = grad._values() if grad.is_sparse else grad
    if values.is_complex():
        values = torch.view_as_real(values)
    if values.element_size() < 4:
        return values.sum(dtype=torch.float32)
    return values.sum()


def _first_nonfinite(torch: Any, pending: list[tuple[Any, list[Any]]]) -> tuple[str, str] | None:
    """The first node in ``pending`` with a non-finite output, read with one sync per device."""
    flat = [flag for _, flags in pending for flag in flags]
    by_device: dict[Any, list[int]] = {}
    for index, flag in enumerate(flat):
        by_device.setdefault(flag.device, []).append(index)
    finite = [True] * len(flat)
    for indices in by_device.values():
        values = torch.stack([flat[i] for i in indices]).isfinite().tolist()
        for i, value in zip(indices, values, strict=True):
            finite[i] = value
    index = 0
    for node, flags in pending:
        if not all(finite[index : index + len(flags)]):
            return type(node).__name__, _forward_line(node)
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


def _forward_line(node: Any) -> str:
    """``file:line`` of the user's code that ran the op, from anomaly mode's traceback."""
    frames = node.metadata.get("traceback_", []) if hasattr(node, "metadata") else []
    torch_dir = os.path.dirname(sys.modules["torch"].__file__ or "") + os.sep
    for entry in reversed(frames):
        text = entry.strip()
        if not text.startswith('File "'):
            continue
        filename, _, rest = text[6:].partition('", line ')
        # torch's, ours, and code generated by torch.compile (<eval_with_key>.1)
        if filename.startswith((torch_dir, _OWN, "<eval_with_key>")):
            continue
        return f"{os.path.normpath(filename)}:{rest.split(',')[0]}"
    return "<unknown>"
