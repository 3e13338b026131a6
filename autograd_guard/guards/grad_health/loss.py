"""grad_health's loss check: a non-finite loss is said, whether or not its gradients are.

Symptom: a NaN/inf loss with finite gradients trains on, silently (``log(relu(x))``). Any torch.
Remedy: none to the step (its gradients are the step check's). Each ``Tensor.backward()`` of
a one-element floating loss is read for NaN/inf (on CUDA never by waiting: the flag is read
once its copy has arrived, at a later backward call); a non-finite loss is said
(``nonfinite_loss``), the next forward pass watched op by op (a ``TorchFunctionMode``; an
optimizer's step in between is not watched) to name the first op that made a non-finite
value from finite inputs and its line
(``nonfinite_origin``), or why it could not. Not under ``torch.compile`` (no Python per op):
the event says so. Cost: per backward pass, ``.item()`` on the CPU (~7 us, under load); on
CUDA no wait.
"""

from __future__ import annotations

import math
import os
import sys

from autograd_guard._common.callsite import find_callsite
from autograd_guard.guards.grad_health.check import PendingFlag
from autograd_guard.guards.grad_health.words import FRAMEWORKS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from autograd_guard.guards.grad_health.compile import EagerHooks
    from autograd_guard.guards.grad_health.localise import Localiser
    from autograd_guard.guards.grad_health.voice import Voice

LIMIT = 20_000  # the most ops one watched forward pass reads
_OWN = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
LOSS_REMEDY = "keep the loss finite: clamp a log's input (log(x.clamp_min(eps))), give a \
division a safe denominator, or drop a bad batch before backward()"
ONE_OFF = "the next forward pass made no non-finite value (a one-off value: one bad batch?)"
NONE_MADE = "no op of the next forward pass made a non-finite value from finite inputs \
(an op outside torch's Python functions?)"
WATCHED = "the next forward pass is watched to name the op (a nonfinite_origin event follows)"


class LossCheck:
    """Reads each loss (see the module's docstring); owns the ``Tensor.backward``
    replacement, the CUDA flags in flight and the forward pass being watched."""

    def __init__(self, voice: Voice, hooks: EagerHooks, localiser: Localiser) -> None:
        self._voice, self._hooks, self._localiser = voice, hooks, localiser
        self._original: Any = None  # torch's Tensor.backward
        self._plain: Any = None  # the replacement, before EagerHooks made it Dynamo's to skip
        self._wrapper: Any = None  # the replacement in place
        self._pending: list[Any] = []  # CUDA losses' flags, oldest first
        self._finder: Any = None
        self._named: set[str] = set()  # call sites whose loss's op was named

    def watch(self) -> None:
        torch = sys.modules["torch"]
        if self._wrapper is not None and self._wrapper is torch.Tensor.backward:
            return  # watching already (a module imported again)
        self._original = original = torch.Tensor.backward
        self._pending, self._finder, self._named = [], None, set()

        def backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            said = self._read(tensor)
            try:
                return original(tensor, *args, **kwargs)
            finally:
                if said is not None:
                    self._find_next(said)

        self._plain = backward
        self._wrapper = self._hooks.eager(backward)
        torch.Tensor.backward = self._wrapper
        from autograd_guard._common import importer as _importer

        _importer.when_imported("torch._dynamo", self._dynamo)

    def _dynamo(self, _: Any) -> None:
        """Dynamo is imported: the wrapper is made one it never traces (after the step
        hooks, which set ``eager`` up), so a compiled step's ``backward()`` breaks the graph
        there as it would unguarded."""
        torch = sys.modules["torch"]
        if torch.Tensor.backward is self._wrapper:
            self._wrapper = self._hooks.eager(self._plain)
            torch.Tensor.backward = self._wrapper

    def unwatch(self) -> None:
        torch = sys.modules.get("torch")
        if (
            torch is not None
            and self._wrapper is not None
            and torch.Tensor.backward is self._wrapper
        ):
            torch.Tensor.backward = self._original
        self.finished("the run ended before another forward pass")

    def _read(self, loss: Any) -> str | None:
        """Before a backward pass: this loss's value (one host read on the CPU; on CUDA a
        flag read once it has arrived), the watched forward pass's word, the flags ready.
        The call site whose loss was non-finite, for the next forward pass."""
        try:
            torch, finite = sys.modules["torch"], None
            if (
                type(loss) is torch.Tensor
                and loss.numel() == 1
                and loss.is_floating_point()
                and not loss.is_meta  # no values to read
            ):
                if loss.device.type == "cpu":
                    finite = math.isfinite(loss.item()) or _scaled(loss)
                elif not _scaled(loss):  # read once it has arrived, at a later call
                    self._pending.append(PendingFlag(~loss.detach().isfinite().reshape(())))
            if self._finder is not None:
                self.finished(ONE_OFF if finite else NONE_MADE)
            said = None
            while self._pending and self._pending[0].ready():
                if self._pending.pop(0).nonfinite():  # said where backward() is called
                    said = self._said(_backward_site(), "NaN or inf")
            if finite is False:
                said = self._said(_backward_site(), _value(loss))
            return said
        except Exception as exc:  # fail open: the backward pass runs as it would
            self._voice.fail("loss check", exc)
            return None

    def _said(self, site: str, value: str) -> str:
        watch = _compiling()
        self._voice.emit(
            f"the loss passed to backward() is {value}; the step that uses its gradients "
            "runs if they are finite (the step's check decides)",
            action="nonfinite_loss",
            callsite=site,
            remedy=f"{WATCHED}; {LOSS_REMEDY}" if not watch else LOSS_REMEDY,
        )
        if watch:
            self._voice.emit(
                "the op that made the non-finite loss could not be found: torch.compile is "
                "in use, and its graphs run no Python per op",
                action="nonfinite_origin",
                callsite=site,
                remedy="run the step eagerly under torch.autograd.detect_anomaly() to find it",
            )
        return "" if watch else site

    def _find_next(self, site: str) -> None:
        """Watch the next forward pass (from now to the next backward call)."""
        if not site or self._finder is not None or site in self._named:
            return
        if self._localiser.probe is not None:  # the backward localiser is on it
            return
        try:
            finder = _finder_class()(site)
            finder.__enter__()
            self._finder = finder
        except Exception as exc:
            self._voice.fail("loss check", exc)

    def finished(self, why: str) -> None:
        """A watched forward pass is over: the op it found, or ``why`` none was found."""
        finder, self._finder = self._finder, None
        if finder is None:
            return
        finder.stop()
        fields: dict[str, Any] = {"action": "nonfinite_origin", "callsite": finder.site}
        fields["of"] = "loss"
        if finder.found is not None:
            self._named.add(finder.site)
            op, line = finder.found
            self._voice.emit(
                f"the non-finite loss came from {op} on line {line}: the first op of the next "
                "forward pass to make a non-finite value from finite inputs",
                op=op,
                forward=line,
                remedy=LOSS_REMEDY,
                **fields,
            )
            return
        if finder.fed is not None:
            why = (
                f"the next forward pass ran on values already non-finite (weights or inputs): "
                f"its first op to get one was {finder.fed[0]} on line {finder.fed[1]}"
            )
        anomaly = "wrap the step in torch.autograd.detect_anomaly() where it comes again"
        fix = "run with AUTOGRAD_GUARD=fix (it keeps the weights finite), or "
        self._voice.emit(
            f"the op that made the non-finite loss could not be found: {why}",
            remedy=anomaly if self._voice.mode == "fix" else fix + anomaly,
            **fields,
        )


def _backward_site() -> str:
    """The user's line that called ``backward()`` (outside torch, the trainers, this package)."""
    return find_callsite(*FRAMEWORKS, start=sys._getframe(1))


def _value(loss: Any) -> str:
    value = float(loss.detach().reshape(()).item())
    return "NaN" if value != value else ("inf" if value > 0 else "-inf")


_SCALERS = ("torch.amp.grad_scaler", "torch.cuda.amp.grad_scaler")


def _scaled(loss: Any) -> bool:
    """``GradScaler.scale(loss)``: the loss times the scaler's one-element scale, whose
    overflow to inf is expected (GradScaler skips that step and lowers the scale). Read
    where a GradScaler class is imported: a loss times a one-element tensor is taken for it."""
    node = loss.grad_fn
    if type(node).__name__ != "MulBackward0" or not any(m in sys.modules for m in _SCALERS):
        return False
    other = getattr(node, "_saved_other", None)
    return other is not None and other.numel() == 1 and other.dtype == sys.modules["torch"].float32


def _compiling() -> bool:
    """torch.compile has compiled a frame in this process (Dynamo counts each)."""
    utils = sys.modules.get("torch._dynamo.utils")
    frames = getattr(utils, "counters", {}).get("frames", {})
    return bool(sum(frames.values()))


_FINDER: list[type] = []


def _finder_class() -> type:
    """``Finder``, a ``TorchFunctionMode`` made once torch is imported."""
    if not _FINDER:
        _FINDER.append(_make_finder(sys.modules["torch"]))
    return _FINDER[0]


def _make_finder(torch: Any) -> type:
    class Finder(torch.overrides.TorchFunctionMode):  # type: ignore[misc]
        """Reads each op's output; the first non-finite one made from finite inputs."""

        def __init__(self, site: str) -> None:
            super().__init__()
            self.site, self.calls, self.on = site, 0, True
            self.found: tuple[str, str] | None = None  # the first op to make one
            self.fed: tuple[str, str] | None = None  # the first op given one

        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            caller = sys._getframe(1).f_code.co_filename
            if self.on and self.found is None and self.calls < LIMIT and _computes(func):
                if caller.startswith(_OWN) or _stepping(torch, sys._getframe(1)):
                    return out  # the guard's own reads; an optimizer's update (not forward)
                self.calls += 1
                try:
                    if _nonfinite(torch, out):
                        values = (*args, *(kwargs or {}).values())
                        fed = any(_nonfinite(torch, a) for a in values)
                        place = (_op_name(func), _user_line(sys._getframe(1)))
                        if not fed:
                            self.found = place
                        elif self.fed is None:
                            self.fed = place
                except Exception:
                    self.on = False
            return out

        def stop(self) -> None:
            """Off; popped where it is still the innermost mode (else it passes through)."""
            self.on = False
            stack = getattr(torch._C, "_len_torch_function_stack", None)
            get = getattr(torch._C, "_get_function_stack_at", None)
            if stack is not None and get is not None and stack() and get(stack() - 1) is self:
                self.__exit__(None, None, None)

    return Finder


def _stepping(torch: Any, frame: Any) -> bool:
    """The op is an optimizer's update: the nearest ``Optimizer.step`` on the stack called
    it through torch's code and the optimizer's own file only (observe lets a non-finite
    gradient through; the update is not where the value was made). A closure's forward
    pass, which ``step`` calls through the user's code, is watched."""
    torch_dir = os.path.dirname(torch.__file__ or "") + os.sep
    between: list[str] = []
    while frame is not None:
        code = frame.f_code
        if code.co_name == "step" and isinstance(frame.f_locals.get("self"), torch.optim.Optimizer):
            home = code.co_filename
            return all(f.startswith((torch_dir, _OWN)) or f == home for f in between)
        between.append(code.co_filename)
        frame = frame.f_back
    return False


def _computes(func: Any) -> bool:
    """An op, not an attribute read (``tensor.grad``, ``tensor.data``: their values were
    made elsewhere)."""
    return type(func).__name__ not in ("getset_descriptor", "method-wrapper") and not getattr(
        func, "__name__", ""
    ).startswith("__get")


def _nonfinite(torch: Any, value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_nonfinite(torch, v) for v in value)
    return (
        type(value) in (torch.Tensor, torch.nn.Parameter)
        and value.is_floating_point()
        and value.device.type != "meta"
        and not bool(value.detach().isfinite().all())
    )


def _op_name(func: Any) -> str:
    name = str(getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func)))
    head, dot, tail = name.partition(".")
    if dot and head in ("_TensorBase", "TensorBase"):
        name = f"Tensor.{tail}"
    elif dot and head == "_VariableFunctionsClass":
        return f"torch.{tail}"
    module = str(getattr(func, "__module__", None) or "")
    if "." not in name and module.startswith("torch"):
        name = f"{module.replace('torch._C._nn', 'torch.nn.functional')}.{name}"
    return name


def _user_line(frame: Any) -> str:
    torch_dir = os.path.dirname(sys.modules["torch"].__file__ or "") + os.sep
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith((torch_dir, _OWN)):
            return f"{os.path.normpath(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"
