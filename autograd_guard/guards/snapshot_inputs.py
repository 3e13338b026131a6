"""Guard ``snapshot_inputs``: a function that writes into the tensors its caller passed.

Symptom: a kernel or helper modifies an input in place. Through a torch op this bumps
the tensor's version counter (and autograd may later fail with "one of the variables
needed for gradient computation has been modified by an inplace operation"); through a
raw pointer (Warp, a CUDA extension, ``t.numpy()``) nothing notices at all, and the
caller's data is silently wrong.
Affected: whatever the policy names, with ``[[rules]] action = "snapshot"``.
Remedy: ``check = "version"`` compares version counters (cheap; it cannot see raw
writes, and in ``fix`` it switches the rule to ``data`` once a write is seen);
``check = "data"`` keeps a copy, restores the exact bytes in ``fix`` and reports the
largest change. Arguments named in ``outputs`` are written on purpose and exempt.
"""

from __future__ import annotations

import sys

from autograd_guard.guard import Call, Guard, Option, Snapshot, Target

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    Watched = list[tuple[int | str, Any]]


class SnapshotInputs(Guard):
    name = "snapshot_inputs"
    symptom = "a call modifies the tensors its caller passed in"
    remedy = "pass a copy (t.clone()) to the function, or list the argument in its rule's outputs"
    rule_action = "snapshot"
    rule_options = {
        "check": Option(
            str, "version", "version counters, or full copies", choices=("version", "data")
        ),
        "outputs": Option(
            list, [], "arguments written on purpose (names or positions)", items=(str, int)
        ),
        "max_bytes": Option(
            int,
            256 * 2**20,
            "data copies per call at most; beyond, version",
            minimum=0,
            maximum=2**50,
        ),
    }

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._rules: dict[Target, dict[str, Any]] = {
            Target(rule.module, rule.qualname, rule=f"{rule.origin}: {rule.key}"): dict(
                rule.options
            )
            for rule in self.policy.rules_for("snapshot")
        }
        self._parameters: dict[Target, list[str]] = {}
        self._exempt: dict[Target, frozenset[int | str]] = {}
        self._tensor_type: Any = None

    def _targets_to_wrap(self) -> Iterable[Target]:
        return list(self._rules)

    def before(self, call: Call) -> Callable[[], None] | None:
        if self._tensor_type is None:
            if "torch" not in sys.modules:
                return None
            self._tensor_type = sys.modules["torch"].Tensor
        rule = self._rules[call.target]
        if rule["check"] == "version" and not call.kwargs and not rule["outputs"]:
            # The hot path: one comprehension before the call and one after.
            tensor_type, args = self._tensor_type, call.args
            versions = [v._version for v in args if isinstance(v, tensor_type)]
            if not versions:
                return None
            return lambda: self._versions_after(call, args, versions)
        watched = self._inputs(call)
        if not watched:
            return None
        if rule["check"] == "data":
            return self._by_data(call, rule, watched)
        return self._by_version(call, watched)

    def _versions_after(self, call: Call, args: tuple[Any, ...], versions: list[int]) -> None:
        tensor_type = self._tensor_type
        if [v._version for v in args if isinstance(v, tensor_type)] != versions:
            self._version_changed(call, self._inputs(call), versions)

    def _by_version(self, call: Call, watched: Watched) -> Callable[[], None]:
        versions = [t._version for _, t in watched]

        def after() -> None:
            if [t._version for _, t in watched] != versions:
                self._version_changed(call, watched, versions)

        return after

    def _version_changed(self, call: Call, watched: Watched, versions: list[int]) -> None:
        changed = [
            _describe(self._name(call, key), t)
            for (key, t), v in zip(watched, versions, strict=True)
            if t._version != v
        ]
        self._report(call, changed, restored=False, unrestorable=True)
        if self.mode == "fix":
            self._rules[call.target]["check"] = "data"  # so that later calls can be restored

    def _by_data(self, call: Call, rule: dict[str, Any], watched: Watched) -> Callable[[], None]:
        size = sum(t.numel() * t.element_size() for _, t in watched)
        if size > rule["max_bytes"]:
            self.emit(
                f"inputs of {size} bytes exceed max_bytes = {rule['max_bytes']}; "
                "checking version counters only for such calls",
                action="over_byte_limit",
                callsite=str(call.target),
                target=str(call.target),
                level="info",
            )
            return self._by_version(call, watched)
        snapshot = Snapshot()
        for key, tensor in watched:
            snapshot.add(self._name(call, key), tensor)
        return lambda: self._data_after(call, snapshot)

    def _data_after(self, call: Call, snapshot: Any) -> None:
        changes = snapshot.changes()
        if changes:
            restore = self.mode in ("fix", "strict")
            if restore:
                snapshot.restore(changes)
            self._report(call, [c.describe() for c in changes], restored=restore)

    def _report(
        self, call: Call, changes: list[dict[str, Any]], restored: bool, unrestorable: bool = False
    ) -> None:
        names = [c["argument"] for c in changes]
        event = f"{call.target} modified its inputs {names} in place" + (
            "; restored" if restored else ""
        )
        if restored and any(c.get("version_moved") for c in changes):
            # A torch in-place op moved the counter; the restore cannot move it back.
            event += (
                " (through a torch op: graphs that saved them before the call still "
                "cannot run backward, as unguarded)"
            )
        if unrestorable:  # only version counters were compared: no copy to restore from
            event += '; not restored: set check = "data" on this rule to restore such writes' + (
                " (done for its later calls)" if self.mode == "fix" else ""
            )
        self.report(call, "input_modified", event, changes=changes, restored=restored)

    def _inputs(self, call: Call) -> Watched:
        """The caller's tensor arguments (position or keyword), less the declared outputs."""
        tensor_type = self._tensor_type
        exempt = self._exempt.get(call.target)
        if exempt is None:
            exempt = self._exempt[call.target] = self._exempt_keys(call)
        watched: Watched = [
            (i, v)
            for i, v in enumerate(call.args)
            if i not in exempt and isinstance(v, tensor_type)
        ]
        if call.kwargs:
            watched += [
                (k, v)
                for k, v in call.kwargs.items()
                if k not in exempt and isinstance(v, tensor_type)
            ]
        return watched

    def _exempt_keys(self, call: Call) -> frozenset[int | str]:
        """Declared outputs as both positions and names, resolved once per target."""
        names = self._parameter_names(call)
        keys: set[int | str] = set()
        for output in self._rules[call.target]["outputs"]:
            keys.add(output)
            if isinstance(output, int) and output < len(names):
                keys.add(names[output])
            elif isinstance(output, str) and output in names:
                keys.add(names.index(output))
        return frozenset(keys)

    def _name(self, call: Call, key: int | str) -> str:
        if isinstance(key, str):
            return key
        names = self._parameter_names(call)
        return names[key] if key < len(names) else f"args[{key}]"

    def _parameter_names(self, call: Call) -> list[str]:
        names = self._parameters.get(call.target)
        if names is None:
            import inspect

            try:
                names = list(inspect.signature(call.original).parameters)
            except (TypeError, ValueError):
                names = []
            self._parameters[call.target] = names
        return names


def _describe(name: str, tensor: Any) -> dict[str, Any]:
    """A version-counter finding: which tensor, but not by how much (no copy was kept)."""
    return {
        "argument": name,
        "shape": list(tensor.shape),
        "dtype": str(tensor.dtype),
        "max_abs_change": None,
    }


GUARD = SnapshotInputs
