"""Guard ``grad_mode``: a pipeline stage that needs grad is entered with grad off.

Symptom: Unique3D's Gradio entry scripts run ``torch.set_grad_enabled(False)`` under
``__main__``. Grad mode is thread-local and Gradio calls its handlers from worker
threads, where grad is on, so the app works; a direct call of ``reconstruct_stage1()``
on the main thread fails at ``loss.backward()`` with "element 0 of tensors does not
require grad and does not have a grad_fn".
Upstream: AiuniAI/Unique3D#19 and #105.
Affected: any version; the stages are named by ``enable_grad`` rules in the policy.
Remedy: run the stage under ``torch.inference_mode(False)`` and ``torch.enable_grad()``,
with clones of any inference tensors among its arguments; the caller's modes come back
afterwards.
"""

from __future__ import annotations

import sys

from autograd_guard._guard import Call, Guard, Target

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

NO_GRAD_MESSAGE = "does not require grad and does not have a grad_fn"
_MAX_DEPTH = 3


class GradMode(Guard):
    name = "grad_mode"
    symptom = "a stage that calls backward() is entered with grad disabled or in inference mode"
    upstream = "https://github.com/AiuniAI/Unique3D/issues/19"
    remedy = "call the stage inside 'with torch.enable_grad():' and outside torch.inference_mode()"
    rule_action = "enable_grad"

    def watch(self) -> Iterable[Target]:
        return [Target(rule.module, rule.qualname) for rule in self.policy.rules_for("enable_grad")]

    def risky(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and (
            not torch.is_grad_enabled() or torch.is_inference_mode_enabled()
        )

    def handle(self, call: Call) -> Any:
        torch = sys.modules["torch"]
        inference = torch.is_inference_mode_enabled()
        found = _count_inference_tensors(torch, (call.args, call.kwargs), 0)
        cause = "inference mode" if inference else "grad disabled"
        if not self.intervene(
            call,
            "enable_grad",
            f"stage entered with {cause}; grad re-enabled",
            cause=cause,
            cloned_inference_tensors=found,
        ):
            return self._proceed_with_note(call, call.args, call.kwargs, fixed=False)
        with torch.inference_mode(False), torch.enable_grad():
            args, kwargs = call.args, call.kwargs
            if found:
                args, kwargs = _clone_inference_tensors(torch, (args, kwargs), 0)
            return self._proceed_with_note(call, args, kwargs, fixed=True)

    def _proceed_with_note(
        self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any], fixed: bool
    ) -> Any:
        try:
            return call.proceed(args, kwargs)
        except RuntimeError as exc:
            if NO_GRAD_MESSAGE in str(exc) and hasattr(exc, "add_note"):
                exc.add_note(_note(str(call.target), fixed))
            raise


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


def _count_inference_tensors(torch: Any, value: Any, depth: int) -> int:
    if isinstance(value, torch.Tensor):
        return int(value.is_inference())
    if depth >= _MAX_DEPTH:
        return 0
    if isinstance(value, (list, tuple)):
        return sum(_count_inference_tensors(torch, v, depth + 1) for v in value)
    if isinstance(value, dict):
        return sum(_count_inference_tensors(torch, v, depth + 1) for v in value.values())
    return 0


def _clone_inference_tensors(torch: Any, value: Any, depth: int) -> Any:
    """A copy of ``value`` with inference tensors cloned (call under inference_mode(False))."""
    if isinstance(value, torch.Tensor):
        return value.clone() if value.is_inference() else value
    if depth >= _MAX_DEPTH:
        return value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_clone_inference_tensors(torch, v, depth + 1) for v in value)
    if isinstance(value, list):
        return [_clone_inference_tensors(torch, v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {k: _clone_inference_tensors(torch, v, depth + 1) for k, v in value.items()}
    return value


GUARD = GradMode
