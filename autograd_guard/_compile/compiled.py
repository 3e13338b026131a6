"""The guards under ``torch.compile`` and TorchScript.

A wrapt proxy passes for the original function, so Dynamo would trace the original's code
past the guard. Each proxy's type carries a ``_torchdynamo_inline`` function instead (see
``_runtime.proxies``), which Dynamo traces in the proxy's place: it asks, while tracing, how the
guarded call goes into the graph: the guard's traceable remedy (``Guard._traced``), else
the guarded call run eagerly at a graph break, else, under ``fullgraph=True``, the
original, said in one event. The question is answered by a function Dynamo runs rather
than traces (``_dynamo_marked_constant``, as ``torch._dynamo.assume_constant_result``
marks it), so that nothing of torch is imported before a compile needs it.
"""

from __future__ import annotations

import sys
import types

from autograd_guard._common import STATE
from autograd_guard._compile.checks import refuse_in_graph, traced_callsite, translator
from autograd_guard._compile.dynamo_frames import skipped
from autograd_guard.errors import GuardError, drop_own_frames

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from autograd_guard._common.call import Target
    from autograd_guard._compile.checks import Guard

_TRACED_IDS = iter(range(1 << 62))  # names the modules of traceable copies
TRACED, EAGER, UNGUARDED = 0, 1, 2  # how a guarded call goes into a graph


def make_inline(guard: Guard, target: Target, original: Callable[..., Any]) -> Callable[..., Any]:
    """What torch.compile traces in place of the proxy of ``original``."""
    inline = traceable(
        _run_compiled,
        guard=guard,
        original=original,
        proxy=None,
        traced=None,
        eager=None,
        tried=False,
    )
    state = inline.__globals__["compiled"]
    method = "." in target.qualname

    @marked_constant
    def how() -> int:
        return _choose(guard, target, state)

    @marked_constant
    def in_graph() -> bool:
        return dynamo_fullgraph() or (method and not _method_graph_breaks_work())

    state.how, state.in_graph = how, in_graph
    return inline


def bind_proxy(inline: Callable[..., Any], proxy: Any) -> None:
    """The proxy that ``inline`` stands for: it runs eagerly at a graph break.

    ``torch.compile(proxy)`` itself needs nothing here: Dynamo calls the proxy, whose
    wrapper frame it skips (see ``_compile.dynamo_frames``), and compiles the original as the
    guard calls it, as it would compile the original unguarded."""
    inline.__globals__["compiled"].proxy = proxy


def _run_compiled(*args: Any, **kwargs: Any) -> Any:
    # Read while tracing, so Dynamo guards the graph on it: after uninstall() a compiled
    # caller recompiles, with the original.
    if not compiled.guard.active:  # type: ignore[name-defined]  # noqa: F821
        return compiled.original(*args, **kwargs)  # type: ignore[name-defined]  # noqa: F821
    how = compiled.how()  # type: ignore[name-defined]  # noqa: F821
    if how == TRACED:
        return compiled.traced(*args, **kwargs)  # type: ignore[name-defined]  # noqa: F821
    if how == EAGER:
        return compiled.eager(*args, **kwargs)  # type: ignore[name-defined]  # noqa: F821
    return compiled.original(*args, **kwargs)  # type: ignore[name-defined]  # noqa: F821


def _choose(guard: Guard, target: Target, state: Any) -> int:
    """Runs while torch.compile traces a call of the guarded function."""
    _prepare(guard, target, state)
    if state.traced is not None:
        return TRACED
    if not state.in_graph():
        return EAGER
    if dynamo_fullgraph():
        what = "traced by torch.compile(fullgraph=True), where this guard cannot run"
        remedy = "compile without fullgraph=True so that the guarded call runs eagerly"
    else:  # see _method_graph_breaks_work
        what = "a method traced by this torch's torch.compile, where this guard cannot run"
        remedy = "call the method outside the compiled function, or use torch 2.14 or older"
    what = f"{what}: calls inside that graph are not guarded"
    if guard.mode == "strict":
        refuse_in_graph(guard, target, "compiled_unguarded", what, remedy)
    cannot_run(guard, target, "compiled_unguarded", what, remedy)
    return UNGUARDED


def _prepare(guard: Guard, target: Target, state: Any) -> None:
    """The guarded call as it runs at a graph break, and the guard's traced remedy: made
    once, while torch.compile traces. The inline stays what Dynamo traces in the proxy's
    place: a trace that took another path when it restarts after a graph break fails
    (Dynamo's speculation log), so nothing is swapped while a trace runs."""
    if state.eager is None:
        state.eager = sys.modules["torch"]._dynamo.disable(_calling(state.proxy))
    if state.tried:
        return
    state.tried = True
    try:
        state.traced = guard.traced(target, state.original)
        # a traced remedy may still run the guarded call at a graph break
        namespace = getattr(state.traced, "__globals__", {}).get("compiled")
        if namespace is not None:
            namespace.eager, namespace.in_graph = state.eager, state.in_graph
    except Exception as exc:
        guard.fail("compile", exc)


def _method_graph_breaks_work() -> bool:
    """False where Dynamo (torch 2.15) inlines a method through ``_torchdynamo_inline`` as a
    ``WrapperUserMethodVariable`` around a function variable, which it rebuilds at a graph
    break from the class's function, calling it without the instance."""
    import inspect

    functions = sys.modules.get("torch._dynamo.variables.functions")
    method_variable = getattr(functions, "WrapperUserMethodVariable", None)
    if method_variable is None or "reconstruct" in vars(method_variable):
        return True
    parameters = list(inspect.signature(method_variable.__init__).parameters)
    return parameters[1:2] != ["fn"]


def marked_constant(function: Callable[..., Any]) -> Callable[..., Any]:
    """Dynamo runs ``function`` while tracing, and puts its result in the graph as a
    constant (what ``torch._dynamo.assume_constant_result`` does, without importing it).
    A strict refusal (``refuse_in_graph``) leaves it as the one frame of the guard in the
    error's traceback (torch 2.1 keeps Dynamo's frames)."""

    def constant(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except GuardError as strict:
            drop_own_frames(strict)  # this raise adds back one: its own
            raise strict  # autograd-guard strict: the message says why

    constant._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return constant


def _calling(proxy: Any) -> Callable[..., Any]:
    """A plain function that calls ``proxy``: what runs at a graph break (Dynamo takes a
    method's proxy, reached through the class, for a bound method)."""

    def call_guarded(*args: Any, **kwargs: Any) -> Any:
        return proxy(*args, **kwargs)

    return call_guarded


@marked_constant
def dynamo_fullgraph() -> bool:
    """Whether torch.compile is tracing right now with ``fullgraph=True``."""
    current = translator()
    return bool(
        getattr(current, "one_graph", False) or getattr(current, "error_on_graph_break", False)
    )


@skipped  # called by a proxy's methods, which run eagerly in compiled regions
def dynamo_tracing() -> bool:
    """Whether torch.compile is tracing on this thread right now."""
    return translator() is not None


def traceable(template: Callable[..., Any], **state: Any) -> Callable[..., Any]:
    """A copy of the module-level ``template`` whose global ``compiled`` holds ``state``.

    What ``Guard._traced`` returns must not be a closure: for a method, Dynamo guards the
    traced function's closure through the wrapper, which forwards to the original's. The
    copy's module is in ``sys.modules`` until ``uninstall()`` (see ``_engine.released``).
    """
    # Dynamo finds a traced function's globals through sys.modules[__name__].
    name = f"autograd_guard._traced_{template.__name__}_{next(_TRACED_IDS)}"
    module = types.ModuleType(name)
    module.__dict__.update(template.__globals__)
    namespace = types.SimpleNamespace(**{"in_graph": dynamo_fullgraph, "eager": None, **state})
    module.__dict__.update(__name__=name, compiled=namespace)
    with STATE.patch_lock:
        sys.modules[name] = module
        STATE.traced_modules.append(name)
    return types.FunctionType(template.__code__, module.__dict__, template.__name__)


def remedy_report(guard: Guard, target: Target, action: str, what: str) -> Callable[[], None]:
    """For traceable remedies: call this in the traced code to log, while torch.compile
    traces the remedy, that it was compiled into a graph. Dynamo runs it rather than
    traces it (``torch._dynamo.comptime`` is not run by torch < 2.2 in such code)."""

    def report() -> None:
        guard.emit(
            f"{what} (compiled into a torch.compile graph)",
            action=action,
            callsite=traced_callsite(target),
            target=str(target),
        )

    return marked_constant(report)


def scripted_report(guard: Guard, target: Target) -> Callable[[], None]:
    """What to call when ``torch.jit.script`` reads the guarded function's modifier: it
    compiles the original's source, without the guard. Said once (script reads the
    modifier several times per compile)."""
    said: list[bool] = []

    def report() -> None:
        if not said:
            said.append(True)
            _scripted(guard, target)

    return report


def _scripted(guard: Guard, target: Target) -> None:
    cannot_run(
        guard,
        target,
        "scripted_unguarded",
        "compiled by TorchScript, where this guard cannot run: calls in the scripted code "
        "are not guarded",
        "leave the guarded function out of torch.jit.script (torch.jit.ignore)",
    )


def cannot_run(guard: Guard, target: Target, action: str, what: str, remedy: str) -> None:
    """One event: ``target`` runs where the guard cannot, so those calls are unguarded."""
    guard.emit(
        f"{target} is {what}",
        action=action,
        callsite=str(target),
        target=str(target),
        remedy=remedy,
    )
