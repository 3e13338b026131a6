"""grad_audit's re-runs of a Function's forward: on copies of its inputs, never touching
the caller's tensors, random streams or warnings.

Only a forward whose arguments are values is re-run: tensors, numbers, strings, ``None``,
dtypes, devices and tuples of those. A module, a ``torch.Generator``, a list or any other
object passed in may be changed by the forward (a running mean, a counter, a generator's
state): a re-run would change it again, so such a call is not audited. Side effects
through globals and closures cannot be seen: a re-run repeats them (documented).

No random number generator is ever set or restored (another thread may be drawing from
it): the states of torch's default generators (CPU, and CUDA where initialised), Python's
``random`` and NumPy's are compared around the real forward, and a forward that drew
from one is not audited (a random forward). Warnings a re-run raises go through the
user's filters (a location already warned stays quiet), and are not shown: the
``showwarning`` hook is replaced while a re-run runs, which, unlike
``warnings.catch_warnings``, leaves the registry of warnings already shown intact.
"""

from __future__ import annotations

import contextlib
import random
import sys
import warnings

from autograd_guard.guards.grad_audit.elsewhere import Elsewhere

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

VALUES = (int, float, bool, str, type(None))  # arguments a forward cannot change


def plain(torch: Any, value: Any, depth: int = 3) -> bool:
    """A value the forward cannot change: a tensor, a number, a string, None, a dtype, a
    device, or a tuple of those."""
    if isinstance(value, (torch.Tensor, torch.dtype, torch.device, *VALUES)):
        return True
    return isinstance(value, tuple) and depth > 0 and all(plain(torch, v, depth - 1) for v in value)


def random_states(torch: Any, devices: list[Any]) -> list[Any]:
    """The states of the default generators a forward may draw from (read, never set)."""
    states: list[Any] = [torch.get_rng_state(), random.getstate()]
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available() and cuda.is_initialized():
        states += [cuda.get_rng_state(d) for d in devices if d.type == "cuda"]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states.append(numpy.random.get_state()[1])
    return states


def _same_states(torch: Any, a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            if not torch.equal(x, y):
                return False
        elif type(x).__module__ == "numpy":
            if not bool((x == y).all()):
                return False
        elif x != y:
            return False
    return True


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
        self.elsewhere = Elsewhere(tensors)  # inputs whose gradient goes to an attribute
        self.devices = list({t.device for t in tensors})
        self.versions = [t._version for t in tensors]
        self.states = random_states(torch, self.devices)

    def why_not(self, args: tuple[Any, ...], seconds: float, bound: float) -> str | None:
        """Why the real forward that just ran is not to be re-run ("" for a forward that
        wrote its inputs, ``mark_dirty``: silently), or None."""
        torch = sys.modules["torch"]
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if [t._version for t in tensors] != self.versions:
            return ""
        if not _same_states(torch, self.states, random_states(torch, self.devices)):
            return "a random forward (it drew from a default random generator)"
        if seconds > bound:
            return f"one forward took {seconds * 1e3:.0f} ms (over max_forward_ms)"
        return None

    def tensor_positions(self) -> list[tuple[Any, Any]]:
        """(position or keyword, copy) of each tensor argument, in torch's order."""
        torch = sys.modules["torch"]
        found: list[tuple[Any, Any]] = [
            (i, a) for i, a in enumerate(self.args) if isinstance(a, torch.Tensor)
        ]
        return found + [(k, v) for k, v in self.kwargs.items() if isinstance(v, torch.Tensor)]

    def run(self, changes: dict[Any, Any], dtype: Any = None) -> tuple[Any, ...]:
        """The forward's outputs (None where not a tensor) with the arguments in
        ``changes`` replaced (and every floating-point tensor argument cast to ``dtype``)."""
        torch = sys.modules["torch"]
        args = [changes.get(i, a) for i, a in enumerate(self.args)]
        kwargs = {k: changes.get(k, v) for k, v in self.kwargs.items()}
        if dtype is not None:
            args = [_cast(torch, a, dtype) for a in args]
            kwargs = {k: _cast(torch, v, dtype) for k, v in kwargs.items()}
        with unshown(), torch.no_grad():
            output = self.original(self.cls, *args, **kwargs)
        top = output if isinstance(output, tuple) else (output,)
        return tuple(t if isinstance(t, torch.Tensor) else None for t in top)


@contextlib.contextmanager
def unshown() -> Iterator[None]:
    """Warnings raised inside go through the user's filters and are not shown: the
    ``showwarning`` hook is replaced (``catch_warnings`` would reset the registry of
    warnings already shown)."""
    shown = warnings.showwarning
    warnings.showwarning = _unshown
    try:
        yield
    finally:
        warnings.showwarning = shown


def _unshown(*args: Any, **kwargs: Any) -> None:
    """A re-run's warning: passed the user's filters, not shown (it is the guard's)."""


def _copy(torch: Any, value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _cast(torch: Any, value: Any, dtype: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    return value
