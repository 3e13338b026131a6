"""Helpers of the ``grad_health`` guard: naming parameters, and a short-lived probe that
finds the backward op which first produced a non-finite gradient.

The probe costs nothing until it is armed (after a non-finite step). Armed, it turns on
anomaly mode with ``check_nan=False`` (forward tracebacks are recorded in each node's
metadata, nothing raises) and, for each ``backward()``, hooks every node of the graph to
look at what it returns; then it puts everything back.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_OWN = os.path.dirname(os.path.abspath(__file__)) + os.sep


def parameter_names(params: list[Any]) -> list[str]:
    """Qualified names (``backbone.0.weight``) from the modules that own the parameters,
    found by one scan of live objects (run only when something is reported)."""
    import gc

    torch = sys.modules["torch"]
    wanted = {id(p) for p in params}
    names: dict[int, str] = {}
    module_type = torch.nn.Module
    for obj in gc.get_objects():
        if issubclass(type(obj), module_type):  # type(): never a proxy's __class__
            for name, param in obj.named_parameters():
                # the outermost module gives the longest, most telling name
                if id(param) in wanted and len(name) > len(names.get(id(param), "")):
                    names[id(param)] = name
    return [names.get(id(p), f"<unnamed {tuple(p.shape)}>") for p in params]


class BackwardProbe:
    """Records up to ``steps`` backward passes to find where a non-finite value appeared."""

    def __init__(self, steps: int) -> None:
        self.remaining = steps
        self.armed = False
        self.origin: tuple[str, str] | None = None  # (backward op, forward file:line)
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

    def step_done(self) -> None:
        self.remaining -= 1
        if self.remaining <= 0 or self.origin is not None:
            self.disarm()

    def _probed_backward(self, tensors: Any, *args: Any, **kwargs: Any) -> Any:
        torch = sys.modules["torch"]
        roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        if self.origin is None:
            for node in _graph([t.grad_fn for t in roots if t.grad_fn is not None]):
                node.register_hook(self._checker(node))
        return self._backward(tensors, *args, **kwargs)

    def _checker(self, node: Any) -> Any:
        def check(grad_inputs: Any, grad_outputs: Any) -> None:
            if self.origin is None and not _finite(grad_inputs) and _finite(grad_outputs):
                self.origin = (type(node).__name__, _forward_line(node))

        return check


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


def _finite(grads: Any) -> bool:
    torch = sys.modules["torch"]
    return all(
        g is None or not g.is_floating_point() or bool(torch.isfinite(g).all()) for g in grads
    )


def _forward_line(node: Any) -> str:
    """``file:line`` of the user's code that ran the op, from anomaly mode's traceback."""
    frames = node.metadata.get("traceback_", []) if hasattr(node, "metadata") else []
    torch_dir = os.path.dirname(sys.modules["torch"].__file__ or "") + os.sep
    for entry in reversed(frames):
        text = entry.strip()
        if not text.startswith('File "'):
            continue
        filename, _, rest = text[6:].partition('", line ')
        if filename.startswith((torch_dir, _OWN)):
            continue
        return f"{os.path.normpath(filename)}:{rest.split(',')[0]}"
    return "<unknown>"
