"""Guard ``warp_torch_args``: torch tensors passed straight to ``wp.launch`` under a Tape.

Symptom: inside ``with wp.Tape():`` a ``torch.Tensor`` given to ``wp.launch`` is
corrupted by ``tape.backward()``: the gradient is added into its values (a tensor of
ones becomes twos), with no error. ``Tape.get_adjoint()`` returned the argument itself
for anything that was not a Warp array, so the adjoint kernel accumulated into the
caller's buffer. A tensor that requires grad makes the launch fail on every version
("Can't call numpy() on Tensor that requires grad"): Warp reads the array interface and
never calls ``wp.from_torch``, so no gradient can reach it.
Affected: warp-lang 1.3.0 to 1.5.1 (1.0 to 1.2 reject torch tensors; 1.6.0 and later
drop the gradient instead).
Upstream: NVIDIA/warp#394, "Fix unintended modification of non-Warp arrays during the
backward pass" (1.6.0).
Remedy: ``convert`` passes ``wp.from_torch(t, dtype=<the kernel parameter's dtype>)``,
which has no gradient buffer to write into; ``snapshot`` copies the tensors when
``Tape.backward`` starts and puts back any that it changed. ``bridge_grads`` (opt-in,
any version) converts leaf tensors that require grad (and tensors that retain their
gradient) with ``requires_grad=True``, so that ``tape.backward`` fills ``t.grad``; only in
fix, as that conversion sets ``t.grad`` to zeros. A non-leaf tensor is left to Warp, which
rejects it as unguarded, and named: a gradient in its ``.grad`` would never reach the
leaves it was computed from, and reading that ``.grad`` makes torch warn.
"""

from __future__ import annotations

import sys

from autograd_guard.guard import Call, Guard, Option, Snapshot, Target, argument

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

# Positions in wp.launch(kernel, dim, inputs, outputs, adj_inputs, adj_outputs, device,
# stream, adjoint, record_tape, ...), the same from 1.3 to 1.19.
INPUTS, OUTPUTS, RECORD_TAPE = 2, 3, 9


class WarpTorchArgs(Guard):
    name = "warp_torch_args"
    distribution = "warp-lang"
    affected = ">=1.3.0,<1.6.0"
    symptom = "tape.backward() adds gradients into torch tensors passed to wp.launch"
    upstream = "https://github.com/NVIDIA/warp/pull/394"
    remedy = (
        "pass wp.from_torch(t, dtype=...) instead of the torch tensor, "
        "or upgrade warp-lang to 1.6 or later"
    )
    targets = (
        # wp.launch: up to 1.12 in warp.context, from 1.10 in warp._src.context
        *(
            Target(module, "launch", aliases=("warp:launch",), check="_launch_check")
            for module in ("warp.context", "warp._src.context")
        ),
        # Tape.backward, for the snapshot action
        *(
            Target(module, "Tape.backward", check="_backward_check", handle="_backward")
            for module in ("warp.tape", "warp._src.tape")
        ),
    )
    options = {
        "action": Option(
            str, "convert", "how to protect the tensors", choices=("convert", "snapshot")
        ),
        "bridge_grads": Option(bool, False, "give tensors that require grad a Warp gradient"),
    }

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._context: ModuleType | None = None
        self._protected: Any = None  # tape -> [(name, tensor)], for the snapshot action
        self._bridge = bool(self.config["bridge_grads"])
        self._writes_into_tensors = False  # the installed version is affected

    def _needed(self) -> bool:
        return self._bridge or self.is_affected()

    def _attach(self, module: ModuleType, target: Target | None) -> None:
        self._writes_into_tensors = self.is_affected()  # without bridge_grads
        if hasattr(module, "runtime") and (self._context is None or "_src" in module.__name__):
            self._context = module  # holds `runtime`, whose `tape` records launches

    # -- wp.launch -------------------------------------------------------------------

    def _launch_check(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        # Every wp.launch passes here: plain lookups, no helper calls.
        runtime = getattr(self._context, "runtime", None)
        if getattr(runtime, "tape", None) is None and not self._bridge:
            return False
        torch = sys.modules.get("torch")
        if torch is None:
            return False
        tensor = torch.Tensor
        inputs = (
            kwargs["inputs"] if "inputs" in kwargs else args[INPUTS] if len(args) > INPUTS else ()
        )
        for value in inputs or ():
            if isinstance(value, tensor):
                return True
        outputs = (
            kwargs["outputs"]
            if "outputs" in kwargs
            else args[OUTPUTS]
            if len(args) > OUTPUTS
            else ()
        )
        for value in outputs or ():  # noqa: SIM110 - a generator costs more here
            if isinstance(value, tensor):
                return True
        return False

    def _recording(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        runtime = getattr(self._context, "runtime", None)
        if getattr(runtime, "tape", None) is None:
            return False
        return bool(argument(args, kwargs, "record_tape", RECORD_TAPE, True))

    def handle(self, call: Call) -> Any:
        torch, warp = sys.modules["torch"], sys.modules["warp"]
        kernel = call.argument("kernel", 0)
        params = kernel.adj.args
        inputs = list(call.argument("inputs", INPUTS) or ())
        outputs = list(call.argument("outputs", OUTPUTS) or ())
        recording = self._recording(call.args, call.kwargs)
        bridge: list[tuple[int, Any]] = []  # (index, parameter)
        unreachable: list[tuple[int, Any]] = []
        exposed: list[tuple[int, Any]] = []
        for index, value in enumerate(inputs + outputs):
            if not isinstance(value, torch.Tensor) or index >= len(params):
                continue
            if value.requires_grad:
                if self._bridge:
                    grad_kept = value.is_leaf or value.retains_grad
                    (bridge if grad_kept else unreachable).append((index, params[index]))
            elif recording and self._writes_into_tensors:
                exposed.append((index, params[index]))
        arguments = inputs + outputs
        if unreachable:
            self._not_bridged(call, unreachable)
        if bridge:
            self._bridge_grads(call, warp, arguments, bridge)
        if exposed:
            self._protect(call, warp, arguments, exposed)
        if bridge or exposed:
            call.replace("inputs", INPUTS, arguments[: len(inputs)])
            call.replace("outputs", OUTPUTS, arguments[len(inputs) :])
        return call.proceed()

    def _bridge_grads(
        self, call: Call, warp: Any, arguments: list[Any], bridge: list[tuple[int, Any]]
    ) -> None:
        # Decided on a conversion without a gradient, which leaves t.grad alone, so that an
        # event only names tensors that convert; converted with one (which sets t.grad to
        # zeros) only in fix, after the report.
        convertible = _converted(warp, arguments, bridge, requires_grad=False)
        names = [param.label for _, param, _ in convertible]
        if not convertible or not self.report(
            call,
            "bridge_grads",
            f"torch tensors {names} require grad: given a Warp gradient with wp.from_torch",
            arguments=names,
            remedy="pass wp.from_torch(t, requires_grad=True) for each tensor whose "
            "gradient tape.backward() should fill",
        ):
            return
        items = [(index, param) for index, param, _ in convertible]
        for index, _, array in _converted(warp, arguments, items, requires_grad=True):
            arguments[index] = array

    def _not_bridged(self, call: Call, unreachable: list[tuple[int, Any]]) -> None:
        names = _names(unreachable)
        self.emit(
            f"torch tensors {names} require grad but are not leaves: a Warp gradient in "
            "their .grad would not reach the tensors they were computed from; left to Warp",
            action="not_bridged",
            callsite=call.callsite,
            target=str(call.target),
            arguments=names,
            remedy="call t.retain_grad() before the launch and t.backward(t.grad) after "
            "tape.backward(), or wrap the launch in a torch.autograd.Function",
        )

    def _protect(
        self, call: Call, warp: Any, arguments: list[Any], exposed: list[tuple[int, Any]]
    ) -> None:
        action = self.config["action"]
        if action == "snapshot":
            done = [(i, p, arguments[i]) for i, p in exposed]
        else:  # converted first: an event only names the tensors that were converted
            done = _converted(warp, arguments, exposed, requires_grad=False)
            left = [(i, p) for i, p in exposed if i not in {d[0] for d in done}]
            if left:
                self._not_converted(call, arguments, left)
            if not done:
                return
        remedy = "converted with wp.from_torch" if action == "convert" else "snapshotted"
        if self.mode != "fix":
            remedy = remedy.replace("converted", "would be converted")
        names = [p.label for _, p, _ in done]
        if not self.report(
            call,
            action,
            f"torch tensors {names} passed to wp.launch under a Tape would be "
            f"changed by tape.backward(); {remedy}",
            arguments=names,
            shapes=[list(arguments[i].shape) for i, _, _ in done],
        ):
            return
        if action == "convert":
            for index, _, array in done:
                arguments[index] = array
        else:
            self._protect_until_backward([(i, p) for i, p, _ in done], arguments)

    def _not_converted(self, call: Call, arguments: list[Any], left: list[tuple[int, Any]]) -> None:
        names = _names(left)
        self.emit(
            f"torch tensors {names} passed to wp.launch under a Tape will be changed by "
            "tape.backward(), and wp.from_torch cannot convert them to the kernel's "
            "parameter type: left as they are",
            action="not_converted",
            callsite=call.callsite,
            target=str(call.target),
            arguments=names,
            shapes=[list(arguments[i].shape) for i, _ in left],
        )

    # -- Tape.backward (snapshot action) -----------------------------------------------

    def _protect_until_backward(self, exposed: list[tuple[int, Any]], arguments: list[Any]) -> None:
        import weakref

        if self._protected is None:
            self._protected = weakref.WeakKeyDictionary()
        tape = self._context.runtime.tape  # type: ignore[union-attr]
        watched = self._protected.setdefault(tape, [])
        for index, param in exposed:
            if all(t is not arguments[index] for _, t in watched):
                watched.append((param.label, arguments[index]))

    def _backward_check(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        return self._protected is not None and instance in self._protected

    def _backward(self, call: Call) -> Any:
        # Copy when backward starts: changes the caller made since the launch are kept.
        snapshot = Snapshot()
        for name, tensor in self._protected.get(call.instance, ()):
            snapshot.add(name, tensor)
        result = call.proceed()
        changes = snapshot.changes()
        if changes:
            snapshot.restore(changes)
            self.emit(
                "tape.backward() wrote into torch tensors; their values were restored",
                action="snapshot_restored",
                callsite=call.callsite,
                target=str(call.target),
                changes=[c.describe() for c in changes],
            )
        return result


def _names(items: list[tuple[int, Any]]) -> list[str]:
    return [param.label for _, param in items]


def _converted(
    warp: Any, arguments: list[Any], items: list[tuple[int, Any]], requires_grad: bool
) -> list[tuple[int, Any, Any]]:
    """``(index, parameter, Warp array)`` for each tensor that converts to its kernel
    parameter's type; the others (indexed or fabric arrays, another shape or dtype) are
    left to Warp."""
    done = []
    for index, param in items:
        declared = param.type
        if not isinstance(declared, warp.array):
            continue
        try:
            array = warp.from_torch(
                arguments[index], dtype=declared.dtype, requires_grad=requires_grad
            )
        except (RuntimeError, TypeError, ValueError):
            continue
        if array.ndim == declared.ndim:
            done.append((index, param, array))
    return done


GUARD = WarpTorchArgs
