"""grad_audit's judgement of an injected gradient: the gradient a Function "injector"
carries, against a finite difference of the library call that computed it.

Symptom: POT's ``gromov_wasserstein2(..., loss_fun="kl_loss")`` (0.8.0 to 0.9.3) injects
a gradient for ``C2`` with one term of the wrong sign; fitting ``C2`` by it walks away
from the optimum. Fixed in POT 0.9.4: https://github.com/PythonOT/POT/pull/610. The
injector's own audit sees nothing (its forward returns its input: perturbing the inputs
whose gradient it carries changes nothing).

Remedy: the library call (``library``) is re-called on perturbed copies of each input
the injector carries a gradient for, and ``<gradient, v>`` is compared with the
derivative of the injected value along ``v``, as ``audit`` does for a Function. Solvers
define these gradients: one stopped at a tolerance is a few percent off a finite
difference, by design. So a discrepancy counts only where it is gross along at least
two of three random directions, each trustworthy by ``verdict``'s rules: over
``RELATIVE`` (75 %) of the larger projection, and of a typical one, ``|g| |v| / sqrt(n)``
(a direction nearly orthogonal to the gradient has small projections whose relative
error means little). A gradient that sums to zero (POT's dual potentials, centred: the derivative is
defined only along directions that keep the total mass) is judged along directions that
sum to zero. A library call that draws random numbers is not judged, and the states of
the default generators it moved are put back.
"""

from __future__ import annotations

import fnmatch
import random
import sys
import time

from autograd_guard.guards.grad_audit import library as _library
from autograd_guard.guards.grad_audit.audit import SEED, diffs, dot, norm, same
from autograd_guard.guards.grad_audit.rerun import unshown
from autograd_guard.guards.grad_audit.verdict import ROUNDING, STEP, Projections, kind_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from autograd_guard.guards.grad_audit.library import LibraryCall
    from autograd_guard.guards.grad_audit.rerun import Rerun

RELATIVE = 0.75  # a discrepancy: over 3/4 of the larger side (a solver's tolerance: less)
DIRECTIONS = 3  # random directions per input; two must show the discrepancy
INPUTS = 4  # inputs judged per call, at most


COPY = (
    "an output is a copy or view of an input: its backward defines its gradient "
    "(gradient reversal, scaling, injection)"
)


def plan(
    cls: type, args: tuple[Any, ...], value: Any, needs: Any, rerun: Rerun, config: dict[str, Any]
) -> Injected | str:
    """The judgement of an injector's call (its one output ``value`` is an input that
    needs no gradient, beside inputs that do: the value and the gradient were computed
    elsewhere), or why there is none. A Function whose output is an input that needs a
    gradient (gradient reversal, scaling) defines that gradient on purpose."""
    torch = sys.modules["torch"]
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    tensors = [args[i] for i in positions]
    wanted = [i < len(needs) and bool(needs[i]) for i in positions]
    copied = [n for n, t in enumerate(tensors) if copy_of(torch, value, t)]
    carried = [n for n, w in enumerate(wanted) if w and n not in copied]
    if not copied or any(wanted[n] for n in copied) or not carried:
        return COPY
    call = _library.find(cls.__module__.partition(".")[0], tensors)
    if isinstance(call, str):
        return f"an injector (its output is its input): {call}"
    if any(fnmatch.fnmatchcase(call.name, pattern) for pattern in config["skip"]):
        return ""
    inputs = [n for n in carried if n in call.inputs.values()]
    if not inputs:
        return f"an injector whose library call {call.name} does not take what it carries"
    bound = float(config["max_forward_ms"]) / 1e3
    return Injected(rerun, call, value.detach(), tensors, inputs, bound)


def copy_of(torch: Any, output: Any, tensor: Any) -> bool:
    """The output is this input, exactly (a view, ``x.new(x)``, ``x.clone()``)."""
    return bool(
        tensor.shape == output.shape
        and tensor.dtype == output.dtype
        and torch.equal(tensor, output)
    )


class Injected:
    """One injector call's judgement through its library call."""

    def __init__(
        self,
        rerun: Rerun,
        library: LibraryCall,
        value: Any,
        tensors: list[Any],
        inputs: list[int],
        bound: float,
    ) -> None:
        self.rerun = rerun  # the injector's own (its inputs' attributes are watched)
        self.library = library
        self.value = value  # the injected value (detached)
        # the injector's tensor arguments, copied (each call gets copies of these: the
        # library may write what it is given, never the caller's tensors)
        self.tensors = [t.detach().clone() for t in tensors]
        self.inputs = inputs  # indices among them to judge
        self.bound = bound  # seconds a re-call may take (max_forward_ms)
        self.remedy = INJECTED_REMEDY

    def function(self, op: str) -> str:
        """What the event's ``function`` field names: the library call."""
        return self.library.name

    def event(self, op: str, position: Any, numbers: Projections, kind: str) -> str:
        name = self.library.name
        return (
            f"{name} injects a gradient (through {op}) that disagrees with a finite "
            f"difference of {name} itself (argument {position}, "
            f"{'float64' if kind == 'float64' else 'the input dtype'}): <gradient, v> = "
            f"{numbers.backward:.6g} where re-calling {name} gives {numbers.central:.6g} "
            f"(and {numbers.half:.6g} at half the step), a relative error of "
            f"{numbers.error(numbers.central):.3g}, in two or more of {DIRECTIONS} random "
            "directions: the gradient this call injects is wrong, and training follows it"
        )

    def judge(self, grad_inputs: tuple[Any, ...], grad_outputs: list[Any]) -> list[Any] | str:
        torch = sys.modules["torch"]
        if len(grad_outputs) != 1 or grad_outputs[0] is None or not bool(grad_outputs[0].any()):
            return "no incoming gradient to project"
        u = grad_outputs[0]
        before = _states(torch)
        try:
            found = self._base(torch)
        finally:
            moved = _restore(torch, before)
        if moved:
            return f"its library call {self.library.name} draws random numbers"
        if isinstance(found, str):
            return found
        dtype, path, base = found
        judged = []
        for index in self.inputs[:INPUTS]:
            grad = grad_inputs[index] if index < len(grad_inputs) else None
            if grad is None:
                continue
            kind = kind_of(dtype or self.tensors[index].dtype)
            numbers = [
                self._direction(torch, u, grad, index, (d, dtype, path, base))
                for d in range(DIRECTIONS)
            ]
            judged.append((self.library.place_of(index), _shown(numbers, kind), kind))
        return judged or "no injected input had a gradient"

    def _base(self, torch: Any) -> tuple[Any, tuple[Any, ...], Any] | str:
        """(the dtype to work in, where the value is in the call's result, the value at
        the point in that dtype), or why the call is not judged."""
        start = time.perf_counter()
        result = self._call(self._changes(None))
        seconds = time.perf_counter() - start
        path = _locate(torch, result, self.value)
        if path is None:
            return f"a re-run of {self.library.name} did not give the injected value again"
        if seconds > self.bound:
            return f"a call of {self.library.name} took {seconds * 1e3:.0f} ms (max_forward_ms)"
        try:
            value = _at(self._call(self._changes(torch.float64)), path)
            if value.dtype == torch.float64 and same(torch, (value,), (self.value,), 1e-3):
                return torch.float64, path, value
        except Exception:
            pass
        return None, path, self.value

    def _changes(self, dtype: Any, index: int | None = None, x: Any = None) -> dict[int, Any]:
        """Fresh copies of the injector's tensor arguments (floating point ones in
        ``dtype``, where given), the ``index``-th replaced by ``x``."""
        changes = {
            i: t.to(dtype if dtype is not None and t.is_floating_point() else t.dtype, copy=True)
            for i, t in enumerate(self.tensors)
        }
        if index is not None:
            changes[index] = x
        return changes

    def _call(self, changes: dict[int, Any]) -> Any:
        with unshown():
            return self.library.call(changes)

    def _direction(
        self, torch: Any, u: Any, grad: Any, index: int, where: tuple[int, Any, Any, Any]
    ) -> Projections:
        """The projections along the ``seed``-th random direction of input ``index``."""
        seed, dtype, path, base = where
        x = self.tensors[index]
        x = x.to(dtype) if dtype is not None else x
        v = _direction(torch, x, grad, SEED + seed)
        scale = float(x.double().pow(2).mean().sqrt())
        h = STEP[kind_of(x.dtype)] * max(1.0, scale)
        real = (self.value,)
        values = {t: self._at(torch, index, x + t * v, dtype, path) for t in (h, -h, h / 2, -h / 2)}
        dots = {t: dot([u], (value,), real) for t, value in values.items()}
        at_base = dot([u], (base,), real)
        size = norm([u]) * norm(diffs((values[h],), (values[-h],), 2 * h, real))
        ratio = float(self.value.double().abs().max()) / max(scale, 1e-300)
        return Projections(
            backward=float((grad.double() * v.double()).sum()),
            central=(dots[h] - dots[-h]) / (2 * h),
            half=(dots[h / 2] - dots[-h / 2]) / h,
            forward=(dots[h] - at_base) / h,
            backward_side=(at_base - dots[-h]) / h,
            scale=size + norm([grad]) * norm([v]),
            rounding=max(
                ROUNDING[kind_of(x.dtype)] * norm([u]) * norm([v]) * ratio,
                norm([grad]) * norm([v]) / max(1, v.numel()) ** 0.5,  # a typical projection
            ),
            relative=RELATIVE,
        )

    def _at(self, torch: Any, index: int, x: Any, dtype: Any, path: Any) -> Any:
        return _at(self._call(self._changes(dtype, index, x)), path)


def _shown(numbers: list[Projections], kind: str) -> Projections:
    """The direction to show: the median of the wrong ones where two or more are wrong
    (the input's verdict), else the first (not wrong)."""
    wrong = sorted((n for n in numbers if n.wrong(kind)), key=lambda n: n.error(n.central))
    return wrong[len(wrong) // 2] if len(wrong) >= 2 else numbers[0]


def _direction(torch: Any, x: Any, grad: Any, seed: int) -> Any:
    """A random direction that keeps the input's structure: symmetric where the input is
    (a structure or cost matrix: POT branches on ``C == C.T``, and a step off it takes
    another solver path), summing to zero where the gradient does."""
    generator = torch.Generator(device=x.device).manual_seed(seed)
    v = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    if _symmetric(torch, x):
        v = (v + v.transpose(-1, -2)) / 2
    if _centred(grad):
        v = v - v.mean()
    return v


def _symmetric(torch: Any, x: Any) -> bool:
    if x.dim() < 2 or x.shape[-1] != x.shape[-2] or x.shape[-1] < 2:
        return False
    # to a relative 1e-5, as NumPy's allclose (POT's test): a float32 ot.dist(x, x) is
    # symmetric only to its rounding, and POT takes it for symmetric
    return bool(x.isfinite().all()) and bool(
        sys.modules["torch"].allclose(x, x.transpose(-1, -2), rtol=1e-5, atol=1e-10)
    )


def _centred(grad: Any) -> bool:
    """A gradient that sums to zero (to rounding): defined along the directions that do."""
    if grad.numel() < 2:
        return False
    total = float(grad.double().abs().sum())
    return total > 0 and abs(float(grad.double().sum())) <= 1e-5 * total


def _locate(torch: Any, result: Any, value: Any) -> tuple[Any, ...] | None:
    """Where ``value`` is in a call's result: itself, an item of a tuple or list, a value of
    a dict, or an attribute of an object (one level)."""
    if _is(torch, result, value):
        return ()
    items: list[tuple[Any, Any]] = []
    if isinstance(result, (tuple, list)):
        items = list(enumerate(result))
    elif isinstance(result, dict):
        items = list(result.items())
    elif hasattr(result, "__dict__"):
        items = [(("attr", k), v) for k, v in vars(result).items()]
    for key, item in items:
        if _is(torch, item, value):
            return (key,)
    return None


def _at(result: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        if isinstance(key, tuple) and key[:1] == ("attr",):
            result = getattr(result, key[1])
        else:
            result = result[key]
    return result


def _is(torch: Any, item: Any, value: Any) -> bool:
    return (
        isinstance(item, torch.Tensor)
        and item.shape == value.shape
        and same(torch, (item.detach(),), (value,), 1e-5)
    )


def _states(torch: Any) -> list[Any]:
    """The default generators' states (torch's CPU one, Python's, NumPy's)."""
    numpy = sys.modules.get("numpy")
    return [torch.get_rng_state(), random.getstate(), numpy.random.get_state() if numpy else None]


def _moved(now: Any, before: Any) -> bool:
    """NumPy's legacy state moved: its key array, position or cached Gaussian."""
    return not bool((now[1] == before[1]).all()) or tuple(now[2:]) != tuple(before[2:])


def _restore(torch: Any, before: list[Any]) -> bool:
    """Put back the states a re-run moved; True where it moved any."""
    now = _states(torch)
    moved = False
    if not torch.equal(now[0], before[0]):
        torch.set_rng_state(before[0])
        moved = True
    if now[1] != before[1]:
        random.setstate(before[1])
        moved = True
    numpy = sys.modules.get("numpy")
    if numpy is not None and before[2] is not None and _moved(now[2], before[2]):
        numpy.random.set_state(before[2])
        moved = True
    return moved


INJECTED_REMEDY = (
    "the gradient this library call hands to torch is not the derivative of the value it "
    "returns: upgrade the library where a release fixes it (POT's kl_loss gradient: "
    "0.9.4), else let torch differentiate the call where the library offers it (POT: "
    'grad="autodiff"), or report it with this event. A solver stopped early gives a '
    "gradient a few percent off, not this much. A gradient that differs on purpose: list "
    'the call in grad_audit\'s skip option (skip = ["package.module.function"])'
)
