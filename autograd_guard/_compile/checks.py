"""What a remedy traced into a ``torch.compile`` graph can promise, asked while Dynamo
traces (from functions it runs rather than traces, see ``_compile.compiled``).

- A grad-mode change traced into a graph (``enable_grad`` around a stage entered with
  grad off) is kept by Dynamo's ``eager`` backend on every torch, and by AOTAutograd
  (inductor, ``aot_eager``) from torch 2.5 only: before, a graph entered without grad is
  compiled for inference whatever it enables inside, so its outputs have no grad.
- Where a guard cannot apply its remedy inside a graph, ``strict`` raises ``GuardError``
  in the user's call: under ``fullgraph=True`` Dynamo lets only its own ``Unsupported``
  errors through as they are, so the error raised while tracing is both.
- Events name the user's line that calls the guarded function in the traced code.
"""

from __future__ import annotations

import sys

from autograd_guard._common.callsite import OWN_DIR, translator_line
from autograd_guard._compile.dynamo_frames import skipped
from autograd_guard.errors import GuardError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar, NoReturn, Protocol

    from autograd_guard._common.call import Target
    from autograd_guard._common.environment import Mode

    class Guard(Protocol):
        """What the compile support uses of a guard (``_runtime.guard.Guard`` has it): it
        sits below the runtime, so it knows a guard only by this shape."""

        name: ClassVar[str]
        mode: Mode
        active: bool

        def emit(self, event: str, *, action: str, callsite: str, **fields: Any) -> bool: ...
        def refuse(self, event: str, *, action: str, callsite: str, **fields: Any) -> NoReturn: ...
        def fail(self, stage: str, exc: BaseException) -> None: ...
        def traced(
            self, target: Target, original: Callable[..., Any]
        ) -> Callable[..., Any] | None: ...


AOT_KEEPS_GRAD_MODE = (2, 5)  # AOTAutograd traces a graph's grad-mode changes from here


@skipped  # called by functions that run eagerly in compiled regions
def translator() -> Any:
    """Dynamo's instruction translator tracing on this thread, else None."""
    tracing = sys.modules.get("torch._dynamo.symbolic_convert")
    if tracing is None:
        return None  # torch.compile has not run in this process
    tls = getattr(tracing, "tls", None)
    if tls is not None:
        return getattr(tls, "current_tx", None)
    # torch < 2.2 keeps no current translator: find it on the stack
    frame = sys._getframe(1)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if hasattr(candidate, "one_graph") and hasattr(candidate, "instructions"):
            return candidate
        frame = frame.f_back  # type: ignore[assignment]
    return None


def grad_mode_kept_in_graph() -> bool:
    """Whether an ``enable_grad`` traced now into the graph is in force when it runs."""
    torch = sys.modules["torch"]
    from packaging.version import Version

    if Version(torch.__version__).release[:2] >= AOT_KEEPS_GRAD_MODE:
        return True
    return _backend_is_eager(translator())


def _backend_is_eager(current: Any) -> bool:
    """Whether the graph being traced goes to Dynamo's ``eager`` backend, which runs it
    as traced (no AOTAutograd)."""
    debugging = sys.modules.get("torch._dynamo.backends.debugging")
    eager = getattr(debugging, "eager", None)
    backend = getattr(getattr(current, "output", None), "compiler_fn", None)
    for _ in range(8):  # the backend, under torch.compile's and the debug wrappers
        if backend is None or eager is None:
            return False
        if backend is eager:
            return True
        backend = next(
            (
                getattr(backend, name)
                for name in ("_torchdynamo_orig_callable", "compiler_fn", "__wrapped__")
                if getattr(backend, name, None) is not None
            ),
            None,
        )
    return False


def traced_callsite(target: Target) -> str:
    """``file:line`` of the user's code that calls ``target`` in the traced code (the
    innermost traced frame outside this package), else ``target (compiled)``."""
    current = translator()
    while current is not None:
        line = translator_line(current, (OWN_DIR,))
        if line is not None:
            return line
        current = getattr(current, "parent", None)
    return f"{target} (compiled)"


def refuse_in_graph(guard: Guard, target: Target, action: str, what: str, remedy: str) -> NoReturn:
    """strict: log ``what`` as an error and raise it as a ``GuardError`` that reaches the
    user's call through torch.compile (see the module's docstring)."""
    try:
        guard.refuse(
            what, action=action, callsite=traced_callsite(target), target=str(target), remedy=remedy
        )
    except GuardError as exc:
        raise _passing_through_dynamo(exc) from None
    raise AssertionError("refuse returned")  # pragma: no cover - refuse always raises


def _passing_through_dynamo(error: GuardError) -> GuardError:
    exc = sys.modules.get("torch._dynamo.exc")
    unsupported = getattr(exc, "Unsupported", None)
    if not isinstance(unsupported, type) or not issubclass(unsupported, Exception):
        return error
    kind = _error_types.get(unsupported)
    if kind is None:
        kind = _error_types[unsupported] = type(
            "GuardError",
            (GuardError, unsupported),
            {
                "__module__": GuardError.__module__,  # shown, and unpickled, as GuardError
                "__doc__": "A GuardError that torch.compile raises as it is.",
                "__init__": lambda self, message: unsupported.__init__(self, message),
            },
        )
    return kind(str(error))  # type: ignore[no-any-return]


_error_types: dict[type, type] = {}
