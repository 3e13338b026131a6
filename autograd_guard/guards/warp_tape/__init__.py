"""Guard ``warp_tape``: arrays overwritten between a ``wp.Tape``'s recording and its backward.

Symptom: ``tape.backward()`` replays each recorded launch's adjoint with the arrays'
*current* contents, not the contents the launch read when it was recorded. A buffer
that a later launch, a ``wp.copy``, an ``array.assign``/``fill_``/``zero_`` or a write
through ``.numpy()`` changes before ``backward()`` (a validation pass that reuses the
prediction buffer is enough) gives a wrong but finite gradient, silently: the fit
converges to a wrong answer, or diverges. torch refuses the same program ("one of the
variables needed for gradient computation has been modified by an inplace operation");
Warp checks nothing unless ``wp.config.verify_autograd_array_access`` is set, and then
only prints.
Affected: every warp-lang version (open in 1.19).
Upstream: NVIDIA/warp#1350, "wp.Tape: backward() evaluates at current array state, not
forward values".
Remedy: while a tape records, the guard notes the arrays each launch reads (the ``inputs``
its kernel reads, from the kernel's own source: ``.access``); before a write changes one,
its contents are copied once (copy-on-write). At
``backward()``, ``observe`` names each overwritten array, the launch that read it and the
write that changed it, with their lines; ``strict`` raises there; ``fix`` gives each
recorded launch's adjoint the copy of what it read: the gradient of the program as written
(as if every write had gone to a fresh buffer); current contents are never touched. Reads
are forgotten once ``backward()`` ran and at ``tape.reset()``: buffers reused after it are
Warp's idiom (a second ``backward()`` of the same recording is neither fixed nor named).
Warp's record of each launch's caller (its visualisation names it) stays the user's frame.

Writes it sees: the ``outputs`` of ``wp.launch`` and the ``inputs`` its kernel may write
(Warp's examples pass every array in ``inputs``; such a copy is compared at
``backward()``), recorded or not, Warp's own launches with ``record_tape=False`` among
them, and a ``Launch`` object's replay (``record_cmd=True``, then ``cmd.launch()``: Warp
1.16 and newer keep its arrays); the destination of ``wp.copy`` (and so of ``wp.clone``),
``array.assign``, ``fill_`` and ``zero_``; a host array whose ``.numpy()`` view was taken
after the read (compared at ``backward()``). Writes it cannot see: a raw pointer
(``array.ptr``, ctypes), another Warp array over the same memory (arrays are known by
identity: a write to the slice ``x[0:2]`` of an ``x`` that was read goes unseen, and the
other way round), another framework's view of it (``wp.to_torch``, ``wp.from_torch``,
DLPack), the adjoints of ``tape.record_func`` callbacks, a ``Launch`` object's replay
before Warp 1.16 (it keeps only packed parameters), and a CUDA graph replay
(``wp.capture_launch``: the graph's kernels run without Python; inside a capture the guard
neither copies nor reports).

Cost: ``wp.launch`` is not wrapped: its own code is compiled anew from Warp's source with
one statement first, which calls the guard while it is switched on or a tape records
(Warp's own ``runtime.tape``; ``.prelude``, verified against the loaded code; the wrapper
where that fails). No frame of the guard's comes between the caller and Warp: its record
of the caller, tracebacks and ``tape.launches`` are as unguarded. With the prelude,
``Tape.__enter__`` is not wrapped (the prelude sees a recording for itself, however it was
started), nor is ``Tape.__exit__`` where no other guard's wrapper calls ``wp.launch`` (Warp
1.6 and newer); a recorded launch that overwrites nothing runs the guard's check in one
frame, given the tape by the statement, and notes only which arrays were read since their
last write (which launch read what is Warp's own record, ``tape.launches``, read at
``backward()``). While no tape records and none keeps reads, the switch is off (``.switch``):
``wp.launch`` pays the statement's test (a global, ``runtime.tape``), ``wp.copy`` wrapt's
C-level call, array methods ~1 us more (binding through the proxy). Where ``wp.launch`` is
wrapped, a recording started without ``Tape.__enter__`` (``runtime.tape`` set by hand, a
subclass whose ``__enter__`` skips ``super()``) is not seen. Rebinding the functions at
``__enter__`` would miss earlier references.
"""

from __future__ import annotations

import sys

from autograd_guard.guard import Call, Guard, Target, argument
from autograd_guard.guards.warp_tape import launch as _launch
from autograd_guard.guards.warp_tape import reads as _reads
from autograd_guard.guards.warp_tape import switch as _switch

# Where wp.launch, wp.copy and `runtime` (whose `tape` records) live: warp.context up to
# 1.9, warp._src.context since (warp.context is then a shim that holds no runtime).
CONTEXTS = ("warp.context", "warp._src.context")
TAPES = ("warp.tape", "warp._src.tape")
ARRAY_WRITES, ENDS = ("assign", "fill_", "zero_", "numpy"), ("backward", "reset")
SCOPE = ("__enter__", "__exit__")
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType, ModuleType
    from typing import Any

REMEDY = (
    "leave the arrays that a recorded launch reads unchanged until tape.backward() "
    "(write into a fresh array), or call tape.backward() before the write"
)


def _watch(module: str, name: str, check: str, handle: str | None = None) -> Target:
    """A target whose wrapper runs only while the guard is switched on (``_wanted``)."""
    alias = (f"warp:{name}",) if module in CONTEXTS and "." not in name else ()
    return Target(module, name, alias, check=check, handle=handle, switch="_wanted")


class WarpTape(_launch.Launches, Guard):
    name = "warp_tape"
    distribution = "warp-lang"
    affected = ""  # every version
    symptom = "tape.backward() uses the current contents of arrays overwritten after recording"
    upstream = "https://github.com/NVIDIA/warp/issues/1350"
    remedy = REMEDY
    targets = (
        *(_watch(m, "launch", "_launch_check") for m in CONTEXTS),
        *(_watch(m, "copy", "_write_check", "_write") for m in CONTEXTS),
        *(_watch(m, "Launch.launch", "_command_check", "_command") for m in CONTEXTS),
        # wp.array's methods, through the package: the class lives in warp.types up to
        # 1.9 and in warp._src.types since, and the shim warp.types no longer exports it
        *(_watch("warp", f"array.{name}", "_write_check", "_write") for name in ARRAY_WRITES),
        *(_watch(m, f"Tape.{name}", "_tape_check", f"_{name}") for m in TAPES for name in ENDS),
        # a recording starts and ends: where wp.launch is wrapped (its prelude could not be
        # compiled), the targets above are switched on and off; with the prelude, only a
        # launch's record of its caller may be due for mending at the end
        *(
            Target(m, f"Tape.{name}", check=f"_{name[2:-2]}_check", handle=f"_{name[2:-2]}")
            for m in TAPES
            for name in SCOPE
        ),
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._context: Any = None  # holds `runtime` (set by wp.init()), whose `tape` records
        self._array: Any = None  # wp.array
        self._tapes: dict[int, _reads.TapeReads] = {}  # by id(tape), while it lives
        self._live: list[_reads.TapeReads] = []  # of the tapes not yet backward()
        # the tape recording now, while it alone keeps reads: its id and its reads'
        # fresh, set together ((0, {}): none; see .launch)
        self._recording: tuple[int, dict[int, Any]] = (0, {})
        self._replay: dict[int, list[dict[int, Any]]] | None = None  # fix, in backward()
        self._busy = False  # the guard's own copies
        self._compiled: tuple[Any, Any] | None = None  # see .launch
        self._mending: list[Any] = []  # see .launch (_mend)
        self._wrapped_launch = True  # see .launch (until wp.launch has its prelude)
        # what each kernel reads and writes (see .access); Warp's modules keep their kernels
        # alive too (a dict: a weak one costs ~0.2 us more a launch)
        self._kernels: dict[Any, tuple[Any, Any]] = {}
        # `_wanted`, the targets' switch, is its list; on, it holds wp.launch's prelude hook
        self._switch = _switch.Switch(self._launch_prelude)
        self._wanted = self._switch.on

    def _attach(self, module: ModuleType, target: Target | None) -> None:
        if module.__name__ in CONTEXTS and (self._context is None or "_src" in module.__name__):
            self._context = module
        if module.__name__ == "warp":
            self._array = module.array
        if getattr(getattr(self._context, "runtime", None), "tape", None) is not None:
            self._switch.recording_already()

    def _detach(self) -> None:
        self._detach_prelude()

    # -- a recording's scope: the switch (see .switch) ------------------------------------
    def _enter_check(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        return self._compiled is None  # the wrapper's switch; the prelude sees runtime.tape

    def _exit_check(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        return self._compiled is None or bool(self._mending) or bool(self._switch.recording)

    def _enter(self, call: Call) -> Any:
        result = call.proceed()  # Warp refuses a second tape: nothing is counted then
        self._switch.entered()
        return result

    def _exit(self, call: Call) -> Any:
        try:
            return call.proceed()
        finally:  # Warp raises if no tape records: counted out all the same
            self._switch.exited()
            self._mend()
            self._settle()

    def _settle(self) -> None:
        self._switch.settle(self._idle)

    def _idle(self) -> bool:
        """No tape keeps reads, no ``backward()`` is being fixed (read under the switch's
        lock, which a tape's first recorded launch takes to keep its reads)."""
        return not self._live and self._replay is None

    # -- wp.launch: see .launch -------------------------------------------------------

    def _reads_of(self, tape: Any) -> _reads.TapeReads:
        key = id(tape)
        reads = self._tapes.get(key)
        if reads is None or reads.tape() is not tape:
            # a tape dropped without backward() drops its reads: the callback holds the
            # key, not the reads (which hold the reference: no cycle keeps their copies)
            reads = self._tapes[key] = _reads.TapeReads(tape, lambda _: self._gone(key))
        self._switch.keep(self._live, reads)  # the recording one last; on: writes are seen
        return reads

    # -- the other writes ------------------------------------------------------------------

    def _write_check(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        # wp.copy (a function: its destination) and the array methods (their instance)
        array = instance if instance is not None else argument(args, kwargs, "dest", 0)
        return bool(self._live) and not self._busy and _reads.changes_any(self._live, (array,))

    def _write(self, call: Call) -> Any:
        method, frame = call.target.qualname.rpartition(".")[2], sys._getframe(1)
        if call.instance is None:
            self._before_write(call.argument("dest", 0), "wp.copy (its destination)", frame)
        elif method != "numpy":
            self._before_write(call.instance, f"array.{method}()", frame)
        elif call.instance.device.is_cpu:  # a view the caller may write through
            self._before_write(call.instance, "a write through array.numpy()", frame, True)
        return call.proceed()

    def _before_write(
        self, array: Any, write: str, frame: FrameType, exposed: bool = False
    ) -> None:
        """A copy of ``array`` before a write (``frame``: at or below its caller) changes
        what a recorded launch read; ``exposed``: the write may leave it as it was (the
        copy is compared at ``backward()``)."""
        key = id(array)
        changed = [reads for reads in self._live if key in reads.fresh]
        if not changed or getattr(array.device, "is_capturing", False):
            return  # a graph capture runs nothing now; its replays are not seen either
        copy = self._copy_of(array)
        site = _reads.caller(frame)
        for reads in changed:
            del reads.fresh[key]
            tape = reads.tape()
            before = len(tape.launches) if tape is not None else 0  # the next launch's index
            reads.versions.setdefault(key, []).append((copy, write, site, exposed, before))

    def _copy_of(self, array: Any) -> Any:
        warp, runtime = sys.modules["warp"], self._context.runtime
        tape, runtime.tape, self._busy = runtime.tape, None, True
        try:
            copy = warp.empty(array.shape, dtype=array.dtype, device=array.device)
            warp.copy(copy, array)
        finally:
            runtime.tape, self._busy = tape, False
        return copy

    # -- Tape.backward and Tape.reset ------------------------------------------------------

    def _tape_check(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        reads = self._tapes.get(id(instance))
        return reads is not None and reads.tape() is instance

    def _backward(self, call: Call) -> Any:
        key = id(call.instance)
        reads = self._tapes.pop(key)  # _tape_check found them
        self._drop(reads)
        try:
            return self._fixed_backward(call, reads)
        except BaseException:  # no backward() took place: a retry is watched as this one was
            self._tapes[key] = reads
            self._live.append(reads)
            self._recording = (0, {})  # more than one tape may keep reads again
            raise
        finally:
            self._settle()

    def _fixed_backward(self, call: Call, reads: _reads.TapeReads) -> Any:
        self._busy = True  # comparing .numpy() views calls .numpy()
        try:
            stale = reads.stale(call.instance.launches, self._read_by)
        finally:
            self._busy = False
        if not stale:
            return call.proceed()
        launches = call.instance.launches
        described = [_reads.describe(launches, reads, read) for read in stale]
        text = _reads.message(described, fixed=self.mode == "fix")
        fixing = self.report(call, "overwritten", text, arrays=described)
        if not fixing:
            return call.proceed()
        self._replay = _reads.replay_plan(launches, reads, stale)
        try:
            return call.proceed()
        finally:
            self._replay = None

    def _reset(self, call: Call) -> Any:
        self._gone(id(call.instance))
        return call.proceed()

    def _gone(self, key: int) -> None:  # reset(), or a tape dropped with its reads kept
        self._drop(self._tapes.pop(key, None))
        self._settle()

    def _drop(self, reads: _reads.TapeReads | None) -> None:
        if reads in self._live:
            self._live.remove(reads)
        if reads is not None and reads.fresh is self._recording[1]:
            self._recording = (0, {})

    def _read_by(self, kernel: Any) -> tuple[int, ...]:
        return self._access(kernel)[0]


GUARD = WarpTape
