"""The guards under ``torch.compile`` and TorchScript.

A wrapt proxy passes for the original function, so Dynamo would trace the original's code
past the guard. The proxy (see ``_proxies``) offers ``_torchdynamo_inline`` instead: the
guard's traceable remedy (``Guard._traced``), else the guarded call run eagerly at a graph
break, else, under ``fullgraph=True``, the original, said in one event.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from autograd_guard._guard import Guard, Target

_TRACED_IDS = iter(range(1 << 62))  # names the modules of traceable copies


def compiled_call(
    guard: Guard, target: Target, original: Callable[..., Any], proxy: Any, fullgraph: bool
) -> Callable[..., Any]:
    """What ``torch.compile`` traces in place of the wrapper."""
    try:
        traced = guard._traced(target, original) if guard.mode in ("observe", "fix") else None
    except Exception as exc:
        guard.fail("compile", exc)
        traced = None
    if traced is not None:
        return traced
    if not fullgraph:
        import torch

        return torch._dynamo.disable(proxy)  # type: ignore[no-any-return, no-untyped-call]
    _cannot_run(
        guard,
        target,
        "compiled_unguarded",
        "traced by torch.compile(fullgraph=True), where this guard cannot run: calls "
        "inside that graph are not guarded",
        "compile without fullgraph=True so that the guarded call runs eagerly",
    )
    return original


def traceable(template: Callable[..., Any], **state: Any) -> Callable[..., Any]:
    """A copy of the module-level ``template`` whose global ``compiled`` holds ``state``.

    What ``Guard._traced`` returns must not be a closure: for a method, Dynamo guards the
    traced function's closure through the wrapper, which forwards to the original's.
    """
    import types

    # Dynamo finds a traced function's globals through sys.modules[__name__].
    name = f"autograd_guard._traced_{template.__name__}_{next(_TRACED_IDS)}"
    module = types.ModuleType(name)
    module.__dict__.update(template.__globals__)
    module.__dict__.update(__name__=name, compiled=types.SimpleNamespace(**state))
    sys.modules[name] = module
    return types.FunctionType(template.__code__, module.__dict__, template.__name__)


def remedy_report(guard: Guard, target: Target, action: str, what: str) -> Callable[[Any], None]:
    """For traceable remedies: ``torch._dynamo.comptime`` this while tracing the remedy, to
    log that it was compiled into a graph."""

    def report(_: Any = None) -> None:
        guard.emit(
            f"{what} (compiled into a torch.compile graph)",
            action=action,
            callsite=f"{target} (compiled)",
            target=str(target),
        )

    return report


def scripted(guard: Guard, target: Target) -> None:
    """``torch.jit.script`` compiles the original's source, without the guard."""
    _cannot_run(
        guard,
        target,
        "scripted_unguarded",
        "compiled by TorchScript, where this guard cannot run: calls in the scripted code "
        "are not guarded",
        "leave the guarded function out of torch.jit.script (torch.jit.ignore)",
    )


def _cannot_run(guard: Guard, target: Target, action: str, what: str, remedy: str) -> None:
    """One event: ``target`` runs where the guard cannot, so those calls are unguarded."""
    guard.emit(
        f"{target} is {what}",
        action=action,
        callsite=str(target),
        target=str(target),
        remedy=remedy,
    )
