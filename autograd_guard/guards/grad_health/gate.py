"""The layer between an optimizer's step hooks and its step body, where grad_health
declines a step.

torch wraps each optimizer class's ``step`` once (``Optimizer._patch_step_function``, run by
``Optimizer.__init__``) with ``Optimizer.profile_hook_step``: the global and per-optimizer
pre-hooks, then the body, then the post-hooks. The body is the wrapper's free variable
``func``; the guard replaces that cell's contents with a gate, so that the check sees the
gradients after every pre-hook (a user's hook that cleans them is respected), and a
skipped step is a body that never ran, as ``GradScaler.step`` never calls
``optimizer.step()`` when it finds an inf: weights, ``state``, every ``param_groups`` key,
the optimizer's attributes and any inner optimizer are untouched, whatever the optimizer.
The same wrapper code serves every torch from 2.1 to the newest; a class whose ``step``
is not (or no longer) that wrapper has no gate, and the guard says it could not skip.
"""

from __future__ import annotations

import functools
import sys

from autograd_guard._compile import dynamo_frames as _dynamo_frames
from autograd_guard.errors import Refused, returning_refusals
from autograd_guard.guards.grad_health.compile import STAND_IN, hook_wrapper, hook_wrapper_code

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    # decide(optimizer args, kwargs) -> RUN, SKIP or CLOSURE; closure_step(body, args, kwargs)
    Decide = Callable[[tuple[Any, ...], dict[str, Any]], object]
    Finish = Callable[[Any, bool, bool], object]  # (optimizer, leave, after): None or Refused
    ClosureStep = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]

RUN, SKIP, CLOSURE = "run", "skip", "closure"
_GATE = "_autograd_guard_gate"  # marks a gate of ours


def make_gate(body: Callable[..., Any], gates: Gates) -> Callable[..., Any]:
    """The body behind a verdict. Traceable by Dynamo: the verdict and the closure step
    are the guard's, disabled for Dynamo once it is imported, so a compiled step body
    stays compiled. The step is finished, and what comes after it done (flags read,
    probes and repairs told), before any post-hook runs (one may raise, or step another
    optimizer); a body that raised is only left."""

    def gate(*args: Any, **kwargs: Any) -> Any:
        verdict = gates.decide(args, kwargs)
        result, ran = None, False
        if verdict == CLOSURE:
            verdict = result = gates.closure_step(body, args, kwargs)
        elif verdict != SKIP and not isinstance(verdict, Refused):
            try:
                result = body(*args, **kwargs)
            except BaseException:
                gates.finish(args[0], True, False)
                raise
            ran = True
        if isinstance(verdict, Refused):  # strict: raised from here, the guard's one frame
            raise verdict.error  # autograd-guard strict: the message says why
        # the step is over (a skipped or closure step has left already): what comes after it
        done = gates.finish(args[0], ran, True)
        if isinstance(done, Refused):
            raise done.error  # autograd-guard strict: the message says why
        return result

    setattr(gate, _GATE, body)
    gate.__wrapped__ = body  # type: ignore[attr-defined]
    return gate


class Gates:
    """The gates in torch's step wrappers, one per wrapper, each undone by ``remove``;
    they call the guard's ``decide``, ``finish`` and ``closure_step``."""

    def __init__(
        self,
        decide: Decide,
        finish: Finish,
        closure_step: ClosureStep,
        made: Callable[[Any], None] | None = None,
    ) -> None:
        # decide and finish return a Refused themselves (no frame more per step)
        self._plain = (decide, finish, returning_refusals(closure_step))
        self.made = made  # told of each optimizer made (never raises)
        self.decide, self.finish, self.closure_step = self._plain
        self._cells: list[tuple[Any, Any]] = []  # (cell, the body it held)
        self._seen: dict[type, tuple[Any, bool]] = {}  # class -> (its step, gated)
        self._watched: tuple[type, Any, Any] | None = None  # (Optimizer, torch's patcher, ours)

    def ensure(self, kind: type) -> bool:
        """Gate every torch step wrapper on ``kind``'s MRO (a subclass's ``step`` calling
        ``super().step()`` runs two). True when the class's own ``step`` is gated."""
        step = getattr(kind, "step", None)
        known = self._seen.get(kind)
        if known is not None and known[0] is step:  # not replaced since
            return known[1]
        gated = False
        for index, klass in enumerate(kind.__mro__):
            own = klass.__dict__.get("step")
            if own is None:
                continue
            cell = self._body_cell(own)
            if cell is not None:
                if not getattr(cell.cell_contents, _GATE, None):
                    self._cells.append((cell, cell.cell_contents))
                    cell.cell_contents = make_gate(cell.cell_contents, self)
                gated = gated or index == _first_step(kind)
        self._seen[kind] = (step, gated)
        return gated

    def watch(self, base: type, ungated: Callable[[], None]) -> None:
        """Gate each class when its first optimizer is made (torch wraps its ``step``
        then, in ``Optimizer._patch_step_function``), and each class made already:
        a step then pays for no step hook. ``ungated`` is called where a class that
        torch hooked has no gate (its steps are checked from the step hooks)."""
        original = base.__dict__.get("_patch_step_function")
        if not callable(original):
            ungated()
            return
        gates = self

        @functools.wraps(original)
        def _patch_step_function(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(optimizer, *args, **kwargs)
            if gates._watched is not None:  # not removed since
                gates.constructed(type(optimizer), ungated)
                if gates.made is not None:
                    gates.made(optimizer)
            return result

        base._patch_step_function = _patch_step_function  # type: ignore[attr-defined]
        self._watched = (base, original, _patch_step_function)
        for kind in _subclasses(base):
            if getattr(kind.__dict__.get("step"), "hooked", False):
                self.constructed(kind, ungated)

    def constructed(self, kind: type, ungated: Callable[[], None]) -> None:
        if getattr(getattr(kind, "step", None), STAND_IN, False):
            return  # the guard's own step (torch 2.1 after a compile): it runs the gate
        try:
            gated = self.ensure(kind)
        except Exception:  # fail open: the step hooks check it
            gated = False
        if not gated:
            ungated()

    def eager(self, dynamo: ModuleType) -> None:
        """Dynamo is imported: the guard's functions run eagerly from now on, kept out of
        Dynamo by ``_compile.dynamo_frames.disabled`` (two C calls a step; torch's
        ``disable`` costs ~2 us more each in a short step), or by torch's ``disable``
        where this torch lacks what that needs (the engine says so)."""
        disable: Callable[[Any], Any] = _dynamo_frames.disabled
        try:
            _dynamo_frames.dynamo_imported(dynamo)  # the engine's own hook may come later
        except Exception:
            disable = dynamo.disable
        self.decide, self.finish, self.closure_step = (disable(f) for f in self._plain)

    def gate(self, body: Callable[..., Any]) -> Callable[..., Any]:
        """A gate for a step that torch's wrapper does not call (torch 2.1 after compile)."""
        return make_gate(body, self)

    def nested(self) -> bool:
        """Another step's gate is on this thread's stack (its step is in progress): what
        the guard's own count of steps in progress says is checked against the frames,
        so a count left behind by an interrupted step (Ctrl-C) never silences it."""
        frame = sys._getframe(1)
        found = 0
        while frame is not None:
            if frame.f_code is _GATE_CODE:
                found += 1
                if found > 1:
                    return True
            frame = frame.f_back  # type: ignore[assignment]
        return False

    def remove(self) -> None:
        if self._watched is not None:
            base, original, ours = self._watched
            if base.__dict__.get("_patch_step_function") is ours:  # not patched over since
                base._patch_step_function = original  # type: ignore[attr-defined]
            self._watched = None
        for cell, body in reversed(self._cells):
            if getattr(cell.cell_contents, _GATE, None) is body:
                cell.cell_contents = body
        self._cells = []
        self._seen = {}

    def _body_cell(self, step: Any) -> Any:
        """The ``func`` cell of torch's wrapper, found through decorators' ``__wrapped__``."""
        wrapper = hook_wrapper(step, wrapper_code())
        if wrapper is None:
            return None
        names, closure = wrapper.__code__.co_freevars, wrapper.__closure__
        return closure[names.index("func")] if "func" in names and closure else None


_WRAPPER_CODE: list[Any] = []  # torch's step wrapper's code object (False: none), once


def wrapper_code() -> Any:
    if not _WRAPPER_CODE:
        _WRAPPER_CODE.append(hook_wrapper_code(sys.modules["torch"]) or False)
    return _WRAPPER_CODE[0] or None


def step_codes() -> tuple[Any, ...]:
    """The code objects of a step in progress: torch's wrapper and the gate."""
    return tuple(code for code in (wrapper_code(), _GATE_CODE) if code is not None)


def drop_gradients(optimizer: Any) -> str:
    """A skip leaves the gradients as they are (a hand-written ``continue`` does; the
    post-hooks and the lines after ``step()`` see them), except, on the ranks of a shared
    model, on an optimizer that has never stepped (every step so far skipped, no state):
    the caller's test; there they are dropped (``.grad = None``, as ``zero_grad()`` does),
    so that it is exactly a fresh optimizer. ``torch.distributed.checkpoint``
    initialises the state of an optimizer without state only where no gradient is left
    (``_init_optim_state``): with them left, the save holds no state while the fresh
    optimizer's load makes one, and the resume fails (``Missing key in checkpoint
    state_dict: optim.state.0.weight.step``). Returns the words for the event."""
    if getattr(optimizer, "state", True):
        return ""
    for group in getattr(optimizer, "param_groups", ()):
        for param in group["params"]:
            param.grad = None
    return (
        "; its gradients were dropped (.grad = None, as optimizer.zero_grad() does): it had "
        "never stepped"
    )


def _subclasses(base: type) -> list[type]:
    """Every subclass of ``base`` defined so far, at any depth."""
    found: list[type] = []
    todo: list[type] = list(base.__subclasses__())
    while todo:
        kind = todo.pop()
        if kind not in found:
            found.append(kind)
            todo += kind.__subclasses__()
    return found


def _first_step(kind: type) -> int:
    """The MRO index of the class that defines ``kind.step``."""
    for index, klass in enumerate(kind.__mro__):
        if "step" in klass.__dict__:
            return index
    return -1


_GATE_CODE = make_gate(print, None).__code__  # type: ignore[arg-type]  # every gate's code
