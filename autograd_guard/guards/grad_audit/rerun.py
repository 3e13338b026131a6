"""grad_audit's re-runs of a Function's forward: on copies of its inputs, with the random
number generators replayed, never touching the caller's tensors or random streams.

At the audited call, before its real forward, the tensor arguments are copied and the RNG
states (torch's CPU generator and the CUDA generators of the inputs' devices, Python's
``random``, NumPy's global one) are kept. A re-run sets them back to what the real forward
saw, runs ``forward`` through torch's own ``apply`` under ``no_grad`` (nested Functions
pass straight through the guard), and the caller's current states are put back after the
last one. Warnings raised by a re-run are dropped: they are the guard's, not the user's.
"""

from __future__ import annotations

import random
import sys
import warnings

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class RandomState:
    """The states of every generator a forward might draw from."""

    def __init__(self, devices: list[Any]) -> None:
        torch = sys.modules["torch"]
        self.cpu = torch.get_rng_state()
        self.cuda = [(d, torch.cuda.get_rng_state(d)) for d in devices if d.type == "cuda"]
        self.python = random.getstate()
        numpy = sys.modules.get("numpy")
        self.numpy = numpy.random.get_state() if numpy is not None else None

    def restore(self) -> None:
        torch = sys.modules["torch"]
        torch.set_rng_state(self.cpu)
        for device, state in self.cuda:
            torch.cuda.set_rng_state(state, device)
        random.setstate(self.python)
        numpy = sys.modules.get("numpy")
        if numpy is not None and self.numpy is not None:
            numpy.random.set_state(self.numpy)


class Rerun:
    """The audited call's forward, to run again at other points."""

    def __init__(
        self, original: Callable[..., Any], cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        torch = sys.modules["torch"]
        self.original, self.cls = original, cls
        self.args = tuple(_copy(torch, a) for a in args)
        self.kwargs = {k: _copy(torch, v) for k, v in kwargs.items()}
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        self.devices = list({t.device for t in tensors})
        self.versions = [t._version for t in tensors]
        self.before = RandomState(self.devices)

    def inputs_written(self, args: tuple[Any, ...]) -> bool:
        """Whether the real forward wrote into a tensor argument (``mark_dirty``)."""
        torch = sys.modules["torch"]
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        return [t._version for t in tensors] != self.versions

    def tensor_positions(self) -> list[tuple[Any, Any]]:
        """(position or keyword, copy) of each tensor argument, in torch's order."""
        torch = sys.modules["torch"]
        found: list[tuple[Any, Any]] = [
            (i, a) for i, a in enumerate(self.args) if isinstance(a, torch.Tensor)
        ]
        return found + [(k, v) for k, v in self.kwargs.items() if isinstance(v, torch.Tensor)]

    def run(self, changes: dict[Any, Any], dtype: Any = None) -> tuple[Any, ...]:
        """The forward's tensor outputs with the arguments in ``changes`` replaced (and
        every floating-point tensor argument cast to ``dtype``, if given)."""
        torch = sys.modules["torch"]
        args = [changes.get(i, a) for i, a in enumerate(self.args)]
        kwargs = {k: changes.get(k, v) for k, v in self.kwargs.items()}
        if dtype is not None:
            args = [_cast(torch, a, dtype) for a in args]
            kwargs = {k: _cast(torch, v, dtype) for k, v in kwargs.items()}
        self.before.restore()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            output = self.original(self.cls, *args, **kwargs)
        top = output if isinstance(output, tuple) else (output,)
        return tuple(t if isinstance(t, torch.Tensor) else None for t in top)


def _copy(torch: Any, value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _cast(torch: Any, value: Any, dtype: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    return value
