"""Guard ``grad_mode``: a pipeline stage that needs grad is entered with grad off.

Symptom: Unique3D's Gradio entry scripts run ``torch.set_grad_enabled(False)`` under
``__main__``. Grad mode is thread-local and Gradio calls its handlers from worker
threads, where grad is on, so the app works; a direct call of ``reconstruct_stage1()``
on the main thread fails at ``loss.backward()`` with "element 0 of tensors does not
require grad and does not have a grad_fn".
Upstream: AiuniAI/Unique3D#19 and #105.
Affected: any version; the stages are named by ``enable_grad`` rules in the policy.
Remedy: run the stage under ``torch.inference_mode(False)`` and ``torch.enable_grad()``,
with clones of any inference tensors among its arguments (a list or dict holding one is
copied; writes into a clone or such a copy are copied back into the caller's objects);
the caller's modes come back afterwards. A generator, coroutine or async generator stage
(also under a ``functools.wraps`` decorator) gets the modes at every resume (``next``,
``send``, ``throw``, ``await``) and the caller's modes between resumes.
"""

from __future__ import annotations

import sys

from autograd_guard._common import STATE
from autograd_guard._compile.checks import grad_mode_kept_in_graph, refuse_in_graph, traced_callsite
from autograd_guard._compile.compiled import cannot_run, dynamo_fullgraph, marked_constant
from autograd_guard._compile.inference_clones import InferenceClones
from autograd_guard._compile.resumable import NO_CONTEXT, GradModes, resume_each_time_under
from autograd_guard.guard import Call, Guard, Target, traceable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

NO_GRAD_MESSAGE = "does not require grad and does not have a grad_fn"


class GradMode(Guard):
    name = "grad_mode"
    symptom = "a stage that calls backward() is entered with grad disabled or in inference mode"
    upstream = "https://github.com/AiuniAI/Unique3D/issues/19"
    remedy = "call the stage inside 'with torch.enable_grad():' and outside torch.inference_mode()"
    rule_action = "enable_grad"
    traced_in_strict = True  # whether a stage is entered with grad off is known while tracing

    def _targets_to_wrap(self) -> Iterable[Target]:
        return [
            Target(rule.module, rule.qualname, rule=f"{rule.origin}: {rule.key}")
            for rule in self.policy.rules_for("enable_grad")
        ]

    def _check_for(self, target: Target) -> Callable[[Any, tuple[Any, ...], dict[str, Any]], bool]:
        # A generator or coroutine runs its body at each resume, not at the call: every
        # call is handled, and the modes are checked at each resume.
        if _resumable(target) is not None:
            return lambda instance, args, kwargs: "torch" in sys.modules
        return self.risky

    def risky(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and (
            not torch.is_grad_enabled() or torch.is_inference_mode_enabled()
        )

    def handle(self, call: Call) -> Any:
        if _resumable(call.target) is not None:
            return self._resumable(call)
        torch = sys.modules["torch"]
        clones = InferenceClones(torch, call.args, call.kwargs)
        if not self._intervene(call, clones.found):
            return self._proceed_with_note(call, call.args, call.kwargs, fixed=False)
        with torch.inference_mode(False), torch.enable_grad():
            args, kwargs = clones.prepare()
            try:
                result = self._proceed_with_note(call, args, kwargs, fixed=True)
            finally:
                clones.copy_back()
                if clones.written:
                    self._copied_back(call, clones.written)
        # A generator made by a wrapper that hides it (no functools.wraps): its body runs
        # at each resume, so the fix logged above is applied there.
        return self._driven(call, result)

    def _traced(self, target: Target, original: Callable[..., Any]) -> Callable[..., Any] | None:
        # A generator or coroutine resumes after the call: with grad off it runs eagerly,
        # where each resume gets grad (no enable_grad in a graph can reach its resumes).
        resumable = _resumable(target) is not None
        traced = traceable(
            _grad_mode_traced,
            torch=sys.modules["torch"],
            original=original,
        )
        state = traced.__globals__["compiled"]
        state.route = marked_constant(lambda: self._route(target, state, resumable))
        return traced

    def _route(self, target: Target, state: Any, resumable: bool) -> int:
        """How a stage entered with grad off goes into the graph (run while tracing)."""
        kept = not resumable and grad_mode_kept_in_graph()
        if not state.in_graph() and (self.mode == "strict" or not kept):
            return EAGER  # at a graph break, guarded as in eager code
        if self.mode == "strict":
            refuse_in_graph(self, target, "enable_grad", f"{_IN_GRAPH}; grad needed", self.remedy)
        if kept:
            done = "grad re-enabled" if self.mode == "fix" else "grad needed"
            self.emit(
                f"{_IN_GRAPH}; {done} in the graph",
                action="enable_grad",
                callsite=traced_callsite(target),
                target=str(target),
            )
            return IN_GRAPH if self.mode == "fix" else ORIGINAL
        where = (
            "under torch.compile(fullgraph=True)"
            if dynamo_fullgraph()
            else "inside torch.compile, where this torch cannot run a method at a graph break"
        )
        why = (
            "no graph can give grad to a generator's or coroutine's resumes"
            if resumable
            else "its backend compiles such a graph for inference on this torch (< 2.5)"
        )
        cannot_run(
            self,
            target,
            "compiled_unguarded",
            f"entered with grad off {where}, and {why}: the stage runs without grad",
            "call the compiled function under torch.enable_grad(), or compile without "
            "fullgraph=True" + ("" if resumable else ", with backend='eager' or torch 2.5+"),
        )
        return ORIGINAL

    def _intervene(self, call: Call, found: int) -> bool:
        torch = sys.modules["torch"]
        cause = "inference mode" if torch.is_inference_mode_enabled() else "grad disabled"
        done = "re-enabled" if self.mode == "fix" else "needed"
        return self.report(
            call,
            "enable_grad",
            f"stage entered with {cause}; grad {done}",
            cause=cause,
            cloned_inference_tensors=found,
        )

    def _proceed_with_note(
        self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any], fixed: bool
    ) -> Any:
        try:
            return call.proceed(args, kwargs)
        except RuntimeError as exc:
            if NO_GRAD_MESSAGE in str(exc):
                self._explain(call, exc, _note(str(call.target), fixed))
            raise

    def _explain(self, call: Call, exc: BaseException, note: str) -> None:
        """Add ``note`` to the exception (PEP 678); Python 3.10's traceback shows no notes,
        so there the note is also an event."""
        if hasattr(exc, "add_note"):
            exc.add_note(note)
            return
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # as the PEP 678 backport
        self.emit(note, action="failure_note", callsite=call.callsite, level="error")

    def _copied_back(self, call: Call, written: list[Any]) -> None:
        self.emit(
            f"the stage wrote into {len(written)} inference tensor(s) it was given; "
            "the writes were copied back into the caller's tensors",
            action="copy_back",
            callsite=call.callsite,
            target=str(call.target),
            level="info",
            shapes=[list(t.shape) for t in written],
        )

    # -- generators and coroutines -------------------------------------------------------

    def _resumable(self, call: Call) -> Any:
        """The generator or coroutine, driven so that each resume runs with grad."""
        call.callsite  # noqa: B018 - the caller's line, while the caller is on the stack
        if self.mode != "fix" or not self.risky(None, (), {}):
            return self._driven(call, call.proceed())
        # A decorator may run the body at the call (priming it, or consuming it): with grad.
        with GradModes(sys.modules["torch"]):
            result = call.proceed()
        driven = self._driven(call, result)
        if driven is result:  # not a generator after all: its body ran here, with grad
            self._intervene(call, 0)
        return driven

    def _driven(self, call: Call, result: Any) -> Any:
        """``result`` driven at each resume if it is a generator or coroutine; anything
        else (a decorator that consumed the generator) is returned as it is."""
        import inspect

        kind = (
            "generator"
            if inspect.isgenerator(result)
            else "coroutine"
            if inspect.iscoroutine(result)
            else "asyncgen"
            if inspect.isasyncgen(result)
            else None
        )
        if kind is None:
            return result
        return resume_each_time_under(kind, result, lambda: self._resume_modes(call))

    def _resume_modes(self, call: Call) -> Any:
        torch = sys.modules["torch"]
        if self.risky(None, (), {}) and self._intervene(call, 0):
            return GradModes(torch)
        return NO_CONTEXT


compiled: Any = None  # the state of each traceable copy of the function below
_IN_GRAPH = "stage entered with grad disabled"
ORIGINAL, EAGER, IN_GRAPH = 0, 1, 2  # the routes of a stage entered with grad off


def _grad_mode_traced(*args: Any, **kwargs: Any) -> Any:
    """What torch.compile traces in place of a stage. Entered with grad off, the stage
    gets ``enable_grad`` in the graph where the graph keeps it, else runs eagerly, guarded,
    at a graph break; where neither can be, one event says so (``_route``)."""
    if compiled.torch.is_grad_enabled():
        return compiled.original(*args, **kwargs)
    route = compiled.route()
    if route == EAGER:
        return compiled.eager(*args, **kwargs)
    if route == IN_GRAPH:
        with compiled.torch.enable_grad():
            return compiled.original(*args, **kwargs)
    return compiled.original(*args, **kwargs)


def _resumable(target: Target) -> str | None:
    """``generator``, ``coroutine`` or ``asyncgen`` for such a target, else None."""
    kind = STATE.kinds.get(target)
    if kind is None:
        import contextlib
        import inspect

        function: Any = sys.modules.get(target.module)
        for part in target.qualname.split("."):
            function = getattr(function, part, None)
        function = getattr(function, "fget", function)  # a property's getter
        with contextlib.suppress(ValueError):  # ValueError: a cycle of __wrapped__
            # Under functools.wraps decorators, the function they wrap decides.
            function = inspect.unwrap(function)
        kind = STATE.kinds[target] = (
            "generator"
            if inspect.isgeneratorfunction(function)
            else "coroutine"
            if inspect.iscoroutinefunction(function)
            else "asyncgen"
            if inspect.isasyncgenfunction(function)
            else ""
        )
    return kind or None


def _note(target: str, fixed: bool) -> str:
    if fixed:
        return (
            f"autograd-guard: grad was re-enabled for the stage {target}, so the tensor was "
            "cut from the graph inside it: look for torch.no_grad(), .detach() or "
            "inputs that do not require grad."
        )
    return (
        f"autograd-guard: the stage {target} was entered with grad disabled (for example "
        "torch.set_grad_enabled(False) in __main__, which worker threads do not inherit). "
        "Call it inside 'with torch.enable_grad():' or run the guard in 'fix' mode."
    )


GUARD = GradMode
