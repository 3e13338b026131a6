"""grad_audit's first calls of each Function class: which are looked at, which audited.

A call is looked at while its class is new (``CALLS`` calls at most, ``LOOKED`` of them
with inputs requiring grad), under grad mode, outside ``torch.compile`` tracing and
functorch transforms, with plain tensors; the class is then marked done and its calls go
straight to torch (``hook``). The audit's own re-runs, and the Functions they call, pass
straight through. The library's and the user's exceptions come back unchanged; an error
of the guard's own is reported and leaves torch's behaviour.
"""

from __future__ import annotations

import fnmatch
import sys
import threading
import time

from autograd_guard._events import events as _events
from autograd_guard.errors import GuardError
from autograd_guard.guards.grad_audit import injected as _injected
from autograd_guard.guards.grad_audit import structure as _structure
from autograd_guard.guards.grad_audit.audit import Audit
from autograd_guard.guards.grad_audit.backward import node_of
from autograd_guard.guards.grad_audit.by_design import by_design
from autograd_guard.guards.grad_audit.rerun import Rerun, plain

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from autograd_guard.guards.grad_audit.hook import ApplyHook
    from autograd_guard.guards.grad_audit.injected import Injected

CALLS = 64  # calls of a class looked at, at most (those without grad included)
LOOKED = 3  # calls of a class with inputs requiring grad checked (structure, backward)
# The libraries the other guards patch (``audit = "patched"``), by top-level package.
PATCHED = frozenset({"warp", "pytorch3d", "gsplat", "intel_extension_for_pytorch"})


class Calls:
    """The first-call half of ``GradAudit``."""

    config: dict[str, Any]
    active: bool
    _hook: ApplyHook
    fail: Callable[[str, BaseException], None]
    site_of: Callable[[type], str]
    _cut: Callable[[str, str, int, str, bool], None]
    _watch: Callable[[str, str, Any, Audit | Injected | None], None]

    def _init_calls(self) -> None:
        self._lock = threading.Lock()
        # by class_key: a class made anew at every call counts as one, and is not kept
        self._calls: dict[Any, int] = {}
        self._looked: dict[Any, int] = {}
        self._audited: dict[Any, int] = {}
        self.skipped: dict[str, str] = {}  # op: why its audit was skipped (the exit note)

    def _count(self, counts: dict[Any, int], cls: type, key: Any, most: int) -> int:
        with self._lock:  # every call counts: a class met only without grad is done too
            counts[key] = seen = counts.get(key, 0) + 1
            if seen >= most:
                self._hook.done[cls] = True
        return seen

    def _first_call(
        self, cls: type, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if self._hook.is_busy() or not self.active:
            return original(cls, *args, **kwargs)
        key = class_key(cls)
        self._count(self._calls, cls, key, CALLS)
        torch = sys.modules["torch"]
        if _standing_down(torch, args, kwargs) or not _structure.inputs_requiring_grad(
            args, kwargs
        ):
            return original(cls, *args, **kwargs)
        self._count(self._looked, cls, key, LOOKED)
        rerun = self._guarded("audit", self._plan, cls, original, args, kwargs)
        start = time.perf_counter()
        output = original(cls, *args, **kwargs)
        seconds = time.perf_counter() - start
        if rerun is not None:
            why = self._guarded("audit", rerun.why_not, args, seconds, self._bound())
            if why is not None:
                self._skip(cls, why)
                rerun = None
        self._guarded("check", self._after, cls, output, rerun, args)
        return output

    def _bound(self) -> float:
        return float(self.config["max_forward_ms"]) / 1e3

    def _skip(self, cls: type, why: str) -> None:
        """Not audited; the exit note says why (nothing where ``why`` is empty)."""
        if why:
            self.skipped.setdefault(f"{cls.__module__}.{cls.__qualname__}", why)

    def _guarded(self, stage: str, step: Callable[..., Any], *args: Any) -> Any:
        try:
            return step(*args)
        except GuardError:
            raise
        except Exception as exc:  # fail open: the call runs as torch runs it
            self.fail(stage, exc)
            return None

    def _plan(
        self, cls: type, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Rerun | None:
        """Copies of the inputs and the RNG states, where this call is to be audited."""
        torch = sys.modules["torch"]
        if kwargs or not self._in_scope(cls) or _once_differentiable(torch, cls):
            return None
        if _distributed(torch) or _elements(torch, args) > self.config["max_elements"]:
            return None
        why = by_design(f"{cls.__module__}.{cls.__qualname__}", args)
        if why is not None:  # not counted: a call of the same Function without it is
            self._skip(cls, why)
            return None
        key = class_key(cls)
        with self._lock:
            if self._audited.get(key, 0) >= self.config["audits"]:
                return None
            self._audited[key] = self._audited.get(key, 0) + 1
        if not all(plain(torch, a) for a in args):
            self._skip(cls, "an argument the forward may change (an object, not a value)")
            return None
        if any(isinstance(a, torch.Tensor) and a.is_complex() for a in args):
            self._skip(cls, "complex inputs")
            return None
        return Rerun(original, cls, args, kwargs)

    def _in_scope(self, cls: type) -> bool:
        scope = self.config["audit"]
        package = cls.__module__.partition(".")[0]
        if scope == "off" or package in ("torch", "autograd_guard"):
            return False
        op = f"{cls.__module__}.{cls.__qualname__}"
        if any(fnmatch.fnmatchcase(op, pattern) for pattern in self.config["skip"]):
            return False
        return scope == "everywhere" or package in PATCHED

    def _after(self, cls: type, output: Any, rerun: Rerun | None, args: tuple[Any, ...]) -> None:
        op = f"{cls.__module__}.{cls.__qualname__}"
        cut, beside, kind = _structure.cut_outputs(output)
        if cut:
            self._cut(op, self.site_of(cls), cut, kind, beside)
            if not beside:
                return
        node = node_of(cls, output)
        if node is None:
            return
        audit = None
        if rerun is not None and not getattr(node, "dirty_tensors", None):
            audit = self._audit_of(cls, output, node, rerun, args)
        self._watch(op, self.site_of(cls), node, audit)

    def _audit_of(
        self, cls: type, output: Any, node: Any, rerun: Rerun, args: tuple[Any, ...]
    ) -> Audit | Injected | None:
        """The call's audit (an injector's: through its library call), or None (and why,
        in the exit note)."""
        top = output if isinstance(output, tuple) else (output,)
        torch = sys.modules["torch"]
        real = tuple(
            t.detach() if isinstance(t, torch.Tensor) and t.grad_fn is node else None for t in top
        )
        outputs = [t for t in real if t is not None]
        if any(t.is_complex() for t in outputs):
            self._skip(cls, "complex outputs")
            return None
        total = _elements(torch, rerun.args) + _elements(torch, tuple(outputs))
        if total > self.config["max_elements"]:
            self._skip(cls, "its inputs and outputs hold more than max_elements")
            return None
        copies = [a for a in rerun.args if isinstance(a, torch.Tensor)]
        needs = getattr(node, "needs_input_grad", ())
        if any(_injected.copy_of(torch, t, a) for t in outputs for a in copies):
            injected: Injected | str = _injected.COPY
            if len(outputs) == 1:
                injected = _injected.plan(cls, args, outputs[0], needs, rerun, self.config)
            if isinstance(injected, str):
                self._skip(cls, injected)
                return None
            return injected
        tensors = [i for i, a in enumerate(rerun.args) if isinstance(a, torch.Tensor)]
        inputs = [n for n, i in enumerate(tensors) if i < len(needs) and needs[i]]
        if inputs and any(t.is_floating_point() for t in outputs):
            return Audit(rerun, real, inputs)
        return None

    def _rerun_safely(
        self, audit: Audit | Injected, grad_inputs: tuple[Any, ...], grad_outputs: list[Any]
    ) -> list[Any] | str:
        """The audit's verdicts, run with the guard busy; an exception of the forward's
        own skips the audit."""
        self._hook.busy.on = True
        _events.unheard(True)
        try:
            with sys.modules["torch"].no_grad():  # a double backward builds no graph of it
                return audit.judge(grad_inputs, grad_outputs)
        except Exception as exc:
            return f"a re-run raised {type(exc).__name__}"
        finally:
            self._hook.busy.on = False
            _events.unheard(False)


def class_key(cls: type) -> tuple[str, str, Any]:
    """A Function class by its module, qualified name and forward's code: the same for
    a class made anew at every call, and no reference to the class itself."""
    code = getattr(getattr(cls, "forward", None), "__code__", None)
    return cls.__module__, cls.__qualname__, code


def _standing_down(torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Nothing is looked at: grad off, functorch transforms, ``torch.jit`` tracing,
    ``torch.compile`` tracing, tensor subclasses."""
    if not torch.is_grad_enabled() or torch._C._are_functorch_transforms_active():
        return True
    if torch._C._get_tracing_state() is not None:
        return True
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and getattr(compiler, "is_compiling", None) is not None:
        if compiler.is_compiling():
            return True
    elif "torch._dynamo" in sys.modules and sys.modules["torch._dynamo"].is_compiling():
        return True
    plain = (torch.Tensor, torch.nn.Parameter)
    values = (*args, *kwargs.values())
    return any(isinstance(a, torch.Tensor) and type(a) not in plain for a in values)


def _once_differentiable(torch: Any, cls: type) -> bool:
    backward = getattr(cls, "backward", None)
    code = getattr(backward, "__code__", None)
    module = sys.modules.get("torch.autograd.function")
    return (
        getattr(backward, "__wrapped__", None) is not None
        and code is not None
        and code.co_filename == getattr(module, "__file__", None)
    )


def _distributed(torch: Any) -> bool:
    """A process group of more than one rank: a forward may run a collective."""
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return False
    return bool(dist.get_world_size() > 1)


def _elements(torch: Any, args: tuple[Any, ...]) -> int:
    return sum(a.numel() for a in args if isinstance(a, torch.Tensor))
