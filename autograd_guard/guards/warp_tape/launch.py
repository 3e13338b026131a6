"""``warp_tape``'s part in ``wp.launch``: before a launch runs, a copy of each array it may
write (its ``outputs``, and the ``inputs`` its kernel writes: see ``.access``) that a
recorded launch read; then the reads of a recorded launch (the ``inputs`` its kernel
reads); and, in a ``backward()`` being fixed, each adjoint given the copies of what its
launch read.

A copy taken for an ``inputs`` write is compared at ``backward()`` (``exposed``): a kernel
that may write an array need not have changed it.
"""

from __future__ import annotations

import sys

from autograd_guard._common import versions as _versions
from autograd_guard.guards.warp_tape import access as _access
from autograd_guard.guards.warp_tape import prelude as _prelude
from autograd_guard.guards.warp_tape import reads as _reads
from autograd_guard.guards.warp_tape.reads import OWN

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import CodeType, FrameType, ModuleType
    from typing import Any

    from autograd_guard.guard import Call, Target

# Positions in wp.launch(kernel, dim, inputs, outputs, adj_inputs, adj_outputs, device, stream,
# adjoint, record_tape, record_cmd, ...) and wp.copy(dest, src, ...), the same in 1.0 to 1.19.
INPUTS, OUTPUTS, ADJOINT, RECORD_TAPE, RECORD_CMD = 2, 3, 8, 9, 10
# Warp releases where another guard's wrapper calls wp.launch (warp_torch_args's range):
# Warp records that wrapper's frame as a launch's caller, mended at the recording's end
WRAPPED_LAUNCH = ">=1.3.0,<1.6.0"
# wp.launch's prelude (see .prelude): the switch it tests (a list: on while the guard keeps
# reads), the hook it calls, and its statement, which also runs while a tape records
# (Warp's own module global `runtime`, whose `tape` records: no wrapper on Tape.__enter__)
NAME = "__autograd_guard_warp_tape__"
HOOK = "__autograd_guard_warp_tape_hook__"
CONDITION = f"{NAME} or record_tape and runtime is not None and runtime.tape is not None"
# the hook is given the recording tape (None: unrecorded), read in Warp's frame
TAPE = "runtime.tape if record_tape and runtime is not None else None"
CALL = f"inputs = {HOOK}(kernel, inputs, outputs, adjoint, {TAPE}, record_cmd)"


class Launches:
    """The launch half of the guard (mixed into ``WarpTape``, which holds these)."""

    _context: Any
    _array: Any
    _live: list[_reads.TapeReads]
    # the tape recording now, while it alone keeps reads: (its id, its reads' fresh)
    _recording: tuple[int, dict[int, Any]]
    _replay: dict[int, list[dict[int, Any]]] | None
    _busy: bool
    _kernels: dict[Any, _access.Access]
    _wanted: list[Any]
    _mending: list[tuple[Any, int, dict[str, Any]]]  # launches whose recorded caller to mend
    _compiled: tuple[Any, CodeType] | None  # wp.launch with its prelude, its own code
    _switch: Any  # .switch.Switch
    _wrapped_launch: bool  # another guard's wrapper may call wp.launch (Warp 1.3 to 1.5)
    active: bool
    version: str | None

    if TYPE_CHECKING:  # the guard's own, in its module

        def _reads_of(self, tape: Any) -> _reads.TapeReads: ...
        def fail(self, stage: str, exc: BaseException) -> None: ...
        def _before_write(
            self, array: Any, write: str, frame: FrameType, exposed: bool
        ) -> None: ...

    # -- wp.launch with a prelude: no wrapper, no frame of ours ----------------------------

    def _prelude(self, module: ModuleType, target: Target) -> bool:
        if target.qualname.startswith("Tape.__"):
            return self._scope_unwrapped(target.qualname)
        if target.qualname != "launch":
            return False
        launch = getattr(module, "launch", None)
        if self._compiled is not None:
            return launch is self._compiled[0]  # another module's name for it
        original = (
            _prelude.install(
                launch, NAME, self._wanted, CALL, CONDITION, {HOOK: self._launch_prelude}
            )
            if launch
            else None
        )
        if original is not None:
            self._compiled = (launch, original)
            self._switch.uncounted()  # the prelude sees a recording for itself
            # another guard's wrapper may call wp.launch: its caller is looked for
            self._wrapped_launch = _versions.is_affected(self.version, WRAPPED_LAUNCH)
        return original is not None

    def _scope_unwrapped(self, qualname: str) -> bool:
        """Whether a tape's ``__enter__``/``__exit__`` goes unwrapped: where wp.launch has
        its prelude (which sees ``runtime.tape`` itself), and, for ``__exit__``, no other
        guard's wrapper calls wp.launch (whose record of the caller is mended there). Their
        method proxies cost ~13 us a tape under load: more than a launch's own check."""
        if self._compiled is None:
            return False
        return qualname.endswith("__enter__") or not self._wrapped_launch

    def _detach_prelude(self) -> None:
        if self._compiled is not None:
            _prelude.undo(self._compiled[0], self._compiled[1], NAME, (HOOK,))
            self._compiled = None

    def _launch_prelude(
        self, kernel: Any, inputs: Any, outputs: Any, adjoint: Any, tape: Any, command: Any
    ) -> Any:
        """Run first in wp.launch, while the switch is on or a tape records: the inputs it
        is to use (``tape``: the tape recording it, or None). The common case in this one
        frame: a launch on the tape that kept reads at its last launch, the only one
        keeping reads, that writes nothing a recorded launch read (its reads are then
        kept; which launch read what is Warp's own record, read at ``backward()``). The
        guard's own copies, a fix's adjoints and a record to mend never meet it: they run
        with no tape, with ``adjoint``, or where the recording is not set (see
        ``_launching``)."""
        key, fresh = self._recording  # one read: set together, maybe by another thread
        if id(tape) != key or adjoint or command:
            frame = sys._getframe(2)
            return self._launch_checked(kernel, inputs, outputs, adjoint, tape, command, frame)
        try:
            try:
                read, written = self._kernels[kernel]
            except KeyError:
                read, written = self._access(kernel)
            count = len(inputs) if inputs else 0
            for position in written:  # loops, not any(): a generator costs more here
                if position < count and id(inputs[position]) in fresh:
                    break
            else:
                for value in outputs or ():
                    if id(value) in fresh:
                        break
                else:
                    array = self._array
                    for position in read:  # its reads kept (TapeReads.note, inlined)
                        if position < count:
                            value = inputs[position]
                            if type(value) is array or isinstance(value, array):
                                fresh[id(value)] = value
                    return inputs
            self._launching(kernel, inputs, outputs, tape, sys._getframe(2))  # copies due
        except Exception as exc:  # fail open: the launch runs as it was called
            self.fail("remedy", exc)
        return inputs

    def _launch_checked(
        self,
        kernel: Any,
        inputs: Any,
        outputs: Any,
        adjoint: Any,
        tape: Any,
        command: Any,
        frame: FrameType,
    ) -> Any:
        """The prelude's other launches (``frame``: wp.launch's caller): unrecorded, the
        first of a recording, with more than one tape keeping reads, called by another
        guard's wrapper; the guard's own copies, an adjoint (given the copies in a
        backward() being fixed), a Launch object made for later, a caller's record due
        for mending."""
        if self._busy or not self.active:
            return inputs
        try:
            if self._mending:
                self._mend()
            if self._replay is not None:
                return self._given(inputs) if adjoint else inputs
            if adjoint or command:
                return inputs  # an adjoint, or a Launch object run later by Warp alone
            if tape is None or (self._wrapped_launch and frame.f_code.co_filename.startswith(OWN)):
                if tape is not None or self._live:
                    self._launch_full(kernel, inputs, outputs, tape, frame)
            else:
                self._launching(kernel, inputs, outputs, tape, frame)
        except Exception as exc:  # fail open: the launch runs as it was called
            self.fail("remedy", exc)
        return inputs

    def _launch_full(
        self, kernel: Any, inputs: Any, outputs: Any, tape: Any, frame: FrameType | None
    ) -> None:
        """The full path, for a launch that is unrecorded or called by another guard's
        wrapper (Warp records that wrapper's frame: mended at the next launch or the
        recording's end)."""
        if frame is None:
            return
        if tape is not None and frame.f_code.co_filename.startswith(OWN):
            caller = _reads.caller_record(frame)  # its line now, not at the mend
            self._mending.append((tape, len(tape.launches), caller))
        self._launching(kernel, inputs, outputs, tape, frame)

    def _mend(self) -> None:
        """Warp's record of a launch's caller, where another guard's wrapper called it:
        the first frame above that wrapper outside this package takes its place. Done at
        the next launch and when the recording ends (no hook runs after Warp records:
        wrapping ``Tape.record_launch`` would cost each recorded launch ~0.4 us)."""
        mending, self._mending = self._mending, []
        for tape, index, caller in mending:
            if index < len(tape.launches):
                _reads.mend_caller(tape.launches[index], caller)

    # -- a Launch object's replay (record_cmd=True, then cmd.launch()) ----------------------

    def _command_check(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        # Warp 1.16 and newer keep a command's arrays in fwd_args (inputs, then outputs);
        # earlier ones keep only their packed parameters: unseen there
        arrays = getattr(instance, "fwd_args", None)
        if not self._live or self._busy or not arrays or instance.adjoint:
            return False
        return bool(self._writes(instance.kernel, arrays, (), self._access(instance.kernel)[1]))

    def _command(self, call: Call) -> Any:
        kernel, frame = call.instance.kernel, sys._getframe(1)
        for array, label, _ in self._writes(
            kernel, call.instance.fwd_args, (), self._access(kernel)[1]
        ):
            label = label.replace("input", "parameter")
            self._before_write(array, f"Launch.launch() of {kernel.key} ({label})", frame, True)
        return call.proceed()

    # -- wp.launch wrapped (where its prelude could not be compiled) ----------------------

    def _launch_check(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        # Every wp.launch passes here: plain lookups. A recorded launch is handled, so
        # that its reads are noted after its own writes and Warp's record of its caller
        # can be mended.
        if self._busy:
            return False
        adjoint = (
            kwargs["adjoint"] if "adjoint" in kwargs else len(args) > ADJOINT and args[ADJOINT]
        )
        if self._replay is not None or adjoint:
            return self._replay is not None and bool(adjoint)
        if kwargs.get("record_cmd") or (len(args) > RECORD_CMD and args[RECORD_CMD]):
            return False  # a Launch object, run later by Warp alone: nothing runs now
        runtime = self._context.runtime
        recorded = (
            kwargs["record_tape"]
            if "record_tape" in kwargs
            else len(args) <= RECORD_TAPE or args[RECORD_TAPE]
        )
        if recorded and runtime is not None and runtime.tape is not None:
            return True
        if not self._live:
            return False
        kernel = kwargs["kernel"] if "kernel" in kwargs else args[0]
        inputs = kwargs["inputs"] if "inputs" in kwargs else args[INPUTS : INPUTS + 1]
        outputs = kwargs["outputs"] if "outputs" in kwargs else args[OUTPUTS : OUTPUTS + 1]
        return bool(
            self._writes(
                kernel,
                inputs if "inputs" in kwargs else inputs and inputs[0],
                outputs if "outputs" in kwargs else outputs and outputs[0],
                self._access(kernel)[1],
            )
        )

    def handle(self, call: Call) -> Any:
        if self._replay is not None:
            return self._adjoint(call)
        kernel, inputs = call.argument("kernel", 0), call.argument("inputs", INPUTS) or ()
        tape = self._context.runtime.tape
        if not call.argument("record_tape", RECORD_TAPE, True):
            tape = None
        self._launching(
            kernel, inputs, call.argument("outputs", OUTPUTS) or (), tape, sys._getframe(1)
        )
        if tape is None:
            return call.proceed()
        count = len(tape.launches)
        result = call.proceed()
        if len(tape.launches) > count:  # Warp named this handler's frame as the caller
            _reads.mend_caller(tape.launches[-1], _reads.caller_record(sys._getframe(1)))
        return result

    def _launching(
        self, kernel: Any, inputs: Any, outputs: Any, tape: Any, frame: FrameType
    ) -> None:
        """Before a launch runs: copies of what it writes that was read, then its reads
        (``tape``: the tape recording it, or None)."""
        try:
            read, written = self._kernels[kernel]
        except KeyError:
            read, written = self._access(kernel)
        if self._live:
            for array, label, of_input in self._writes(kernel, inputs, outputs, written):
                write = f"wp.launch of {kernel.key} ({label})"
                self._before_write(array, write, frame, of_input)
        if tape is not None and inputs:
            reads = self._live[-1] if self._live else None
            if reads is None or reads.tape() is not tape:
                reads = self._reads_of(tape)  # a tape's first recorded launch keeps its reads
            reads.note(inputs, self._array, read)
            # the prelude's common case from the next launch on: one tape keeps reads, and
            # Warp records the caller itself (no other guard's wrapper calls wp.launch)
            one = len(self._live) == 1 and not self._wrapped_launch
            self._recording = (id(tape), reads.fresh) if one else (0, {})

    def _writes(
        self, kernel: Any, inputs: Any, outputs: Any, written: tuple[int, ...]
    ) -> list[tuple[Any, str, bool]]:
        """The arrays that a launch may write (``written``: its kernel's parameters that
        may write) and a recorded launch read (their copies are due), each with its
        parameter's name and whether it came in ``inputs``."""
        found: list[tuple[Any, str, bool]] = []
        live, count = self._live, len(inputs) if inputs else 0
        for position in written:  # loops, not any(): a generator costs more here
            if position < count:
                key = id(inputs[position])
                for reads in live:
                    if key in reads.fresh:
                        found.append((inputs[position], _label(kernel, position, "input"), True))
                        break
        for position, value in enumerate(outputs or ()):
            key = id(value)
            for reads in live:
                if key in reads.fresh:
                    found.append((value, _label(kernel, count + position, "output"), False))
                    break
        return found

    def _access(self, kernel: Any) -> _access.Access:
        try:
            return self._kernels[kernel]
        except KeyError:
            found = self._kernels[kernel] = _access.of(kernel)
            return found

    def _adjoint(self, call: Call) -> Any:
        inputs = call.argument("inputs", INPUTS)
        given = self._given(inputs)
        if given is not inputs:
            call.replace("inputs", INPUTS, given)
        return call.proceed()

    def _given(self, inputs: Any) -> Any:
        """In a ``backward()`` being fixed, the inputs an adjoint launch is given: the
        copies of what its launch read, where they were overwritten."""
        pending = self._replay.get(id(inputs)) if self._replay else None
        if pending:  # launches that share one inputs list run in reverse order
            given = pending.pop(0)
            if given:
                return [given.get(i, a) for i, a in enumerate(inputs)]
        return inputs


def _label(kernel: Any, position: int, kind: str) -> str:
    params = kernel.adj.args
    return f"{kind} {params[position].label!r}" if position < len(params) else f"{kind} {position}"
