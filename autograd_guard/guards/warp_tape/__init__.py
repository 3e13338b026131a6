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
Remedy: while a tape records, the guard notes which arrays each launch reads (its
``inputs``). Before a write changes such an array, its contents are copied once
(copy-on-write: arrays nobody overwrites cost nothing). At ``backward()``, ``observe``
names each overwritten array, the launch that read it and the write that changed it,
with their lines; ``strict`` raises there; ``fix`` gives each recorded launch's adjoint
the copy of what it read, so that the gradient is that of the program as written (as if
every write had gone to a fresh buffer). The arrays' current contents are never touched.
Reads are forgotten at ``backward()`` and ``tape.reset()``: buffers reused after
``backward()`` are Warp's own idiom and cost nothing (so a second ``backward()`` of the
same recording, after such a write, is neither fixed nor named). Warp's tape keeps each launch's
caller (its visualisation names it) as the user's frame, not the guard's wrapper.

Writes it sees: the ``outputs`` of ``wp.launch``, the destination of ``wp.copy`` (and
so of ``wp.clone``), ``array.assign``, ``fill_`` and ``zero_``, and a host array whose
``.numpy()`` view was taken after the read (its contents are compared at ``backward()``;
a view taken before the read is not). Writes it
cannot see: a kernel writing through an array passed in ``inputs``, a raw pointer
(``array.ptr``, ctypes), another Warp array over the same memory (arrays are known by
identity: a write to the slice ``x[0:2]`` of an ``x`` that was read, or to ``x`` after its
slice was read, goes unseen), another framework's view of it (``wp.to_torch``,
``wp.from_torch``, DLPack), the adjoints of ``tape.record_func`` callbacks, and a CUDA
graph replay (``wp.capture_launch``); inside a graph capture it neither copies nor reports.

Cost: ``wp.launch`` and the array methods stay wrapped while no tape records (~1 us per
call). Hooking them only while a tape records or holds reads is not sound: the hook would
be put in place at each ``Tape.__enter__`` by rebinding module attributes, and a reference
bound while it was not there (``from warp import launch`` in a user's module, a helper's
``launch = wp.launch``, a ``functools.partial`` of it, a bound method kept by an object)
would keep calling Warp directly, so the writes that this guard exists for (a validation
pass through such a helper) would go unseen; rebinding the modules' copies costs a scan of
``sys.modules`` per tape, more than ten launches' wrappers.
"""

from __future__ import annotations

import sys
import weakref

from autograd_guard.guard import Call, Guard, Target, argument
from autograd_guard.guards.warp_tape import reads as _reads

# Where wp.launch, wp.copy and `runtime` (whose `tape` records) live: warp.context up to
# 1.9, warp._src.context since (warp.context is then a shim that holds no runtime).
CONTEXTS = ("warp.context", "warp._src.context")
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

# Positions in wp.launch(kernel, dim, inputs, outputs, adj_inputs, adj_outputs, device,
# stream, adjoint, record_tape, ...) and wp.copy(dest, src, ...), the same from 1.0 to 1.19.
INPUTS, OUTPUTS, ADJOINT, RECORD_TAPE = 2, 3, 8, 9
REMEDY = (
    "leave the arrays that a recorded launch reads unchanged until tape.backward() "
    "(write into a fresh array), or call tape.backward() before the write"
)


class WarpTape(Guard):
    name = "warp_tape"
    distribution = "warp-lang"
    affected = ""  # every version
    symptom = "tape.backward() uses the current contents of arrays overwritten after recording"
    upstream = "https://github.com/NVIDIA/warp/issues/1350"
    remedy = REMEDY
    targets = (
        *(
            Target(module, "launch", aliases=("warp:launch",), check="_launch_check")
            for module in CONTEXTS
        ),
        *(
            Target(module, "copy", aliases=("warp:copy",), check="_write_check", handle="_write")
            for module in CONTEXTS
        ),
        # wp.array's methods, through the package: the class lives in warp.types up to
        # 1.9 and in warp._src.types since, and the shim warp.types no longer exports it
        *(
            Target("warp", f"array.{method}", check="_write_check", handle="_write")
            for method in ("assign", "fill_", "zero_", "numpy")
        ),
        *(
            Target(module, f"Tape.{method}", check="_tape_check", handle=f"_{method}")
            for module in ("warp.tape", "warp._src.tape")
            for method in ("backward", "reset")
        ),
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._context: Any = None  # holds `runtime` (set by wp.init()), whose `tape` records
        self._array: Any = None  # wp.array
        self._tapes: Any = weakref.WeakKeyDictionary()  # tape -> TapeReads
        self._live: list[_reads.TapeReads] = []  # of the tapes not yet backward()
        self._replay: dict[int, list[dict[int, Any]]] | None = None  # fix, in backward()
        self._busy = False  # the guard's own copies

    def _attach(self, module: ModuleType, target: Target | None) -> None:
        if module.__name__ in CONTEXTS and (self._context is None or "_src" in module.__name__):
            self._context = module
        if module.__name__ == "warp":
            self._array = module.array

    # -- wp.launch: reads, writes, and the adjoints in a backward() being fixed ----------

    def _launch_check(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        # Every wp.launch passes here: plain lookups. Reads are noted in the check itself;
        # a recorded launch is handled, so that Warp's record of its caller can be mended.
        if self._busy:
            return False
        adjoint = (
            kwargs["adjoint"] if "adjoint" in kwargs else len(args) > ADJOINT and args[ADJOINT]
        )
        if self._replay is not None:
            return bool(adjoint)
        runtime = self._context.runtime
        tape = runtime.tape if runtime is not None else None
        if tape is not None and not adjoint:
            record = (
                kwargs["record_tape"]
                if "record_tape" in kwargs
                else len(args) <= RECORD_TAPE or args[RECORD_TAPE]
            )
            inputs = kwargs["inputs"] if "inputs" in kwargs else args[INPUTS : INPUTS + 1]
            if record and inputs:
                reads = self._live[-1] if self._live else None
                if reads is None or reads.tape() is not tape:
                    reads = self._reads_of(tape)
                inputs = inputs if "inputs" in kwargs else inputs[0]
                site = _reads.caller(sys._getframe(1))
                reads.note(len(tape.launches), inputs, self._array, site)
            if record:
                return True
        if self._live:
            outputs = kwargs["outputs"] if "outputs" in kwargs else args[OUTPUTS : OUTPUTS + 1]
            if outputs and "outputs" not in kwargs:
                outputs = outputs[0]
            return bool(outputs) and self._changes_any(outputs)
        return False

    def _reads_of(self, tape: Any) -> _reads.TapeReads:
        reads: _reads.TapeReads | None = self._tapes.get(tape)
        if reads is None:  # a tape dropped without backward() drops its reads
            reads = self._tapes[tape] = _reads.TapeReads(tape)
            reads.release = weakref.finalize(tape, self._drop, reads)
        if reads in self._live:
            self._live.remove(reads)
        self._live.append(reads)  # the recording one last
        return reads

    def _changes_any(self, arrays: Any) -> bool:
        live = self._live
        for array in arrays:  # loops, not any(): a generator costs more here
            key = id(array)
            for reads in live:
                if key in reads.fresh:
                    return True
        return False

    def handle(self, call: Call) -> Any:
        if self._replay is not None:
            return self._adjoint(call)
        outputs = call.argument("outputs", OUTPUTS) or ()
        if self._live and self._changes_any(outputs):
            kernel = call.argument("kernel", 0)
            args = kernel.adj.args[len(call.argument("inputs", INPUTS) or ()) :]
            for position, value in enumerate(outputs):
                label = args[position].label if position < len(args) else str(position)
                self._before_write(value, f"wp.launch of {kernel.key} (output {label!r})", call)
        tape = self._context.runtime.tape
        if tape is None:
            return call.proceed()
        count = len(tape.launches)
        result = call.proceed()
        if len(tape.launches) > count:  # Warp named this handler's frame as the caller
            _reads.mend_caller(tape.launches[-1], sys._getframe(1))
        return result

    def _adjoint(self, call: Call) -> Any:
        inputs = call.argument("inputs", INPUTS)
        pending = self._replay.get(id(inputs)) if self._replay else None
        if pending:  # launches that share one inputs list run in reverse order
            given = pending.pop(0)
            if given:
                call.replace("inputs", INPUTS, [given.get(i, a) for i, a in enumerate(inputs)])
        return call.proceed()

    # -- the other writes ------------------------------------------------------------------

    def _write_check(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        # wp.copy (a function: its destination) and the array methods (their instance)
        array = instance if instance is not None else argument(args, kwargs, "dest", 0)
        return bool(self._live) and not self._busy and self._changes_any((array,))

    def _write(self, call: Call) -> Any:
        method = call.target.qualname.rpartition(".")[2]
        if call.instance is None:
            self._before_write(call.argument("dest", 0), "wp.copy (its destination)", call)
        elif method != "numpy":
            self._before_write(call.instance, f"array.{method}()", call)
        elif call.instance.device.is_cpu:  # a view the caller may write through
            self._before_write(call.instance, "a write through array.numpy()", call, True)
        return call.proceed()

    def _before_write(self, array: Any, write: str, call: Call, exposed: bool = False) -> None:
        key = id(array)
        changed = [reads for reads in self._live if key in reads.fresh]
        if not changed or getattr(array.device, "is_capturing", False):
            return  # a graph capture runs nothing now; its replays are not seen either
        copy = self._copy_of(array)
        site = _reads.caller(sys._getframe(2))  # above the handler and the wrappers
        for reads in changed:
            del reads.fresh[key]
            reads.versions.setdefault(key, []).append((copy, write, site, exposed))

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
        return instance in self._tapes

    def _backward(self, call: Call) -> Any:
        reads = self._tapes.pop(call.instance)
        self._drop(reads)
        self._busy = True  # comparing .numpy() views calls .numpy()
        try:
            stale = reads.stale()
        finally:
            self._busy = False
        if not stale:
            return call.proceed()
        launches = call.instance.launches
        described = [_reads.describe(launches, reads, read) for read in stale]
        first = described[0]
        more = f" and {len(described) - 1} more" if len(described) > 1 else ""
        fixing = self.report(
            call,
            "overwritten",
            f"{first['kernel']}'s input {first['argument']!r} (read at {first['read_at']}) "
            f"was overwritten by {first['written_by']} at {first['written_at']}{more} before "
            "tape.backward(), which uses the arrays' current contents; "
            + ("each launch was given" if self.mode == "fix" else "fix gives each launch")
            + " the contents it read",
            arrays=described,
        )
        if not fixing:
            return call.proceed()
        self._replay = _reads.replay_plan(launches, reads, stale)
        try:
            return call.proceed()
        finally:
            self._replay = None

    def _reset(self, call: Call) -> Any:
        self._drop(self._tapes.pop(call.instance, None))
        return call.proceed()

    def _drop(self, reads: _reads.TapeReads | None) -> None:
        if reads is not None and reads.release is not None:
            reads.release.detach()  # else it keeps the reads' arrays and copies alive
        if reads in self._live:
            self._live.remove(reads)


GUARD = WarpTape
