"""Guard ``grad_audit``: a gradient that is finite but wrong, or missing, from autograd code.

Symptom: a ``torch.autograd.Function`` whose backward is wrong gives a gradient that is
finite, so nothing else notices: the loss creeps up or stalls. Seen in released
libraries: reentrant ``torch.utils.checkpoint`` of a function that returns a list (torch
does not track tensors inside a list: the segments' gradient is dropped, a wave-propagation
fit went from a misfit of 730 to 9,209); an optimal-transport loss injecting a precomputed
gradient with one term of the wrong sign (POT 0.8.0 to 0.9.3's ``gromov_wasserstein2``
with ``kl_loss``: https://github.com/PythonOT/POT/pull/610, fixed in 0.9.4); Warp's
interop adjoint launch zeroing the incoming gradient in place, so a residual branch
beside the Function gets none
(``gradcheck`` and anomaly mode are test-time tools, or see only NaN/Inf).
Affected: any torch version (2.1 to 2.15), any library's Functions and the user's own.
Upstream: https://github.com/NVIDIA/warp/issues/1728 (a wrong adjoint inside a Function).
Remedy: ``torch.autograd.Function.apply`` is hooked; each Function class's first calls
with inputs that require grad are looked at, then it costs one dict lookup a call.
Structural checks, exact, for torch's own Functions too: outputs that carry no gradient
path back (tensors returned inside a list or dict, none requiring grad: named at the
user's call); a backward that changes its incoming gradient in place (values and version
counter compared around the real backward, through hooks on the call's node). For
Functions defined outside torch (``audit``: everywhere, or only in the libraries the other
guards patch), a finite-difference audit of the real backward at its first calls (at
most ``audits`` per class): ``<backward(u), v>`` with ``u`` the gradient training passed
against ``<u, (f(x + h v) - f(x - h v)) / 2h>`` on re-runs of the forward on copies, RNG
replayed, in float64 where accepted; a discrepancy counts only where it holds at two step
sizes and the one-sided differences agree (``verdict``); anything else is silent. An
injector (its one output is an input that needs no gradient, beside inputs that do: the
value and its gradient were computed elsewhere) is judged through the installed library's
call that computed them, re-called on perturbed copies (``library``, ``injected``). strict
raises, observe and fix log: the audit never changes a gradient. Never audited: a
forward that does not reproduce its output when re-run, inputs whose perturbation changes
nothing, ``mark_dirty``, ``once_differentiable``, keyword arguments, calls under a process
group of more than one rank (a forward may run a collective), tensor subclasses,
``torch.compile`` regions (Dynamo traces the Function itself: nothing is checked there).
"""

from __future__ import annotations

from autograd_guard._common.callsite import find_callsite
from autograd_guard.guard import Guard, Option
from autograd_guard.guards.grad_audit import backward as _backward
from autograd_guard.guards.grad_audit import structure as _structure
from autograd_guard.guards.grad_audit.calls import Calls
from autograd_guard.guards.grad_audit.hook import ApplyHook
from autograd_guard.guards.grad_audit.library import installed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    from autograd_guard.guard import Target
    from autograd_guard.guards.grad_audit.audit import Audit
    from autograd_guard.guards.grad_audit.injected import Injected


class GradAudit(Calls, Guard):
    name = "grad_audit"
    # torch 2.1's Dynamo breaks the graph at such a Function where the hook is in place
    # (its audit then ran on a compiled step's eager part, and on FakeTensors in backward
    # hooks): the guard stands down there. Checked on 2.1.2 (stands down) and 2.13.0.
    distribution = "torch"
    affected = ">=2.2"
    symptom = "a Function's backward gives a wrong (finite) or missing gradient"
    upstream = "https://github.com/NVIDIA/warp/issues/1728"
    remedy = "fix the Function's backward (check it with torch.autograd.gradcheck)"
    modules = ("torch.autograd.function",)
    options = {
        "audit": Option(
            str,
            "everywhere",
            "which Functions get the finite-difference audit at their first calls: every "
            "Function defined outside torch (everywhere), only those of the libraries the "
            "other guards patch (patched), or none (off; the structural checks stay on)",
            choices=("everywhere", "patched", "off"),
        ),
        "audits": Option(
            int, 3, "finite-difference audits per Function class, at most", minimum=0, maximum=20
        ),
        "max_elements": Option(
            int,
            1 << 24,
            "an audited call's tensor arguments and outputs may hold this many elements in "
            "all (the copies and two re-runs' outputs are held at once)",
            minimum=0,
            maximum=1 << 34,
        ),
        "max_forward_ms": Option(
            float,
            100.0,
            "a call whose real forward took longer is not audited (an audit re-runs the "
            "forward up to 18 times; an injector's library call: its first re-call)",
            minimum=0,
            maximum=1e6,
        ),
        "skip": Option(
            list,
            [],
            "Functions never audited, and library calls whose injected gradient is never "
            "judged, by qualified name (module.Class, module.function) or glob pattern "
            '("megatron.core.*"): gradients that differ from the derivative by design',
        ),
    }

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._hook = ApplyHook()
        self._init_calls()
        self._named: set[tuple[str, str, str]] = set()

    def _attach(self, module: ModuleType, target: Target | None) -> None:
        if not self._hook.install(module.Function, self._first_call):
            raise RuntimeError("torch.autograd.Function.apply is not a classmethod here")

    def _detach(self) -> None:
        self._hook.uninstall()

    # -- what the checks found ------------------------------------------------------

    def _name(self, site: str, action: str, event: str, remedy: str, op: str) -> None:
        """Report once per call site and Function class: two Functions called from one
        line (inside one library call) are both named."""
        key = (site, action, op)
        with self._lock:
            first = key not in self._named
            self._named.add(key)
        self.report(site, action, event, remedy=remedy, function=op, always=first)

    def _cut(self, op: str, site: str, count: int, kind: str, beside: bool) -> None:
        event = _structure.cut_event(op, count, kind, beside)
        self._name(site, "cut_gradient", event, _structure.CUT_REMEDY, op)

    def _watch(self, op: str, site: str, node: Any, audit: Audit | Injected | None) -> None:
        def modified(positions: list[int]) -> None:
            event = _backward.modified_event(op, positions)
            self._name(site, "grad_output_modified", event, _backward.MODIFIED_REMEDY, op)

        judge = self._judge(op, site, audit) if audit is not None else None

        def failed(exc: BaseException) -> None:
            self.fail("backward hook", exc)

        prepare = audit.rerun.elsewhere.before if audit is not None else None
        _backward.watch(node, modified, judge, failed, prepare)

    def _judge(self, op: str, site: str, audit: Audit | Injected) -> Callable[..., None]:
        def judge(grad_inputs: tuple[Any, ...], grad_outputs: list[Any]) -> None:
            found = self._rerun_safely(audit, grad_inputs, grad_outputs)
            if isinstance(found, str):
                self.skipped.setdefault(op, found)
                return
            for position, numbers, kind in found:
                if numbers.wrong(kind):
                    event = audit.event(op, position, numbers, kind)
                    self._name(site, "wrong_gradient", event, audit.remedy, audit.function(op))
                    return

        return judge

    def notes(self) -> dict[str, Any]:
        """The audits skipped, and why (in ``status()``: a skipped audit is no finding,
        and correct code produces no event)."""
        return {"audits_skipped": dict(sorted(self.skipped.items()))}

    def site_of(self, cls: type) -> str:
        """The user's line: the first frame outside the Function's library (where it is
        one: installed, not the program's own code)."""
        package = cls.__module__.partition(".")[0]
        return find_callsite(*((package,) if installed(package) else ()))


GUARD = GradAudit
