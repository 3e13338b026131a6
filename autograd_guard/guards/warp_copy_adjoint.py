"""Guard ``warp_copy_adjoint``: the wrong adjoint of a ``wp.copy`` recorded on a ``wp.Tape``.

Symptom: the adjoint of a tape-recorded ``wp.copy`` (and so of ``wp.clone`` and
``array.assign``) *assigns* the destination's gradient to the source's, and never
consumes the destination's. When the source is also read by a later launch, that
launch's gradient contribution is overwritten (often to exactly zero); a write that
the copy made dead leaks its gradient. The gradients are wrong but finite, silently:
iterated (``out = wp.clone(q); step(q, out); q = out``) the gradient through the
copies comes out exactly zero on 1.16 and the fit never moves (in the upstream report,
it went to NaN).
Affected: warp-lang 1.1.0 (copies became differentiable) to 1.16.x; fixed in 1.17.0.
Checked on 1.5.1 and 1.16.0 (affected) and 1.17.0 and 1.19.0 (fixed).
Upstream: NVIDIA/warp#1728, "Tape-recorded wp.copy() / wp.clone() / array.assign()
produces silently wrong gradients" (fixed in 1.17.0).
Remedy: a recorded copy runs unrecorded, and the guard records in its place the adjoint
that 1.17 gives it: the destination window's gradient is *added* into the source
window's, then zeroed (unless the destination has ``retain_grad``). Only copies whose
adjoint the guard can do exactly are replaced: same device, both arrays contiguous, the
same dtype, memory that does not overlap. Any other recorded copy keeps Warp's adjoint
and is named, as is a copy recorded while a CUDA graph is captured. On CPU the adjoint
works on the gradients' NumPy views; on CUDA on their torch views (``wp.to_torch``),
synchronizing the device around it (so a backward() captured in a CUDA graph cannot
run it: record such copies with a kernel of your own).
"""

from __future__ import annotations

import sys

from autograd_guard.guard import Call, Guard, Target, argument

# Where wp.launch, wp.copy and `runtime` (whose `tape` records) live: warp.context up to
# 1.9, warp._src.context since (warp.context is then a shim that holds no runtime).
CONTEXTS = ("warp.context", "warp._src.context")
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

# wp.copy(dest, src, dest_offset=0, src_offset=0, count=0, stream=None), 1.1 to 1.19.
DEST, SRC, DEST_OFFSET, SRC_OFFSET, COUNT = 0, 1, 2, 3, 4


class WarpCopyAdjoint(Guard):
    name = "warp_copy_adjoint"
    distribution = "warp-lang"
    affected = ">=1.1.0,<1.17.0"
    symptom = "tape.backward() gives a recorded wp.copy the wrong adjoint (assigned, not added)"
    upstream = "https://github.com/NVIDIA/warp/issues/1728"
    remedy = "copy with a kernel of your own on the tape, or upgrade warp-lang to 1.17 or later"
    targets = tuple(Target(module, "copy", aliases=("warp:copy",)) for module in CONTEXTS)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._context: Any = None  # holds `runtime` (set by wp.init()), whose `tape` records

    def _attach(self, module: ModuleType, target: Target | None) -> None:
        if module.__name__ in CONTEXTS and (self._context is None or "_src" in module.__name__):
            self._context = module

    def risky(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        # Warp records a copy when a tape is recording and both arrays have a gradient.
        runtime = getattr(self._context, "runtime", None)
        if runtime is None or runtime.tape is None:
            return False
        dest, src = argument(args, kwargs, "dest", DEST), argument(args, kwargs, "src", SRC)
        return getattr(dest, "grad", None) is not None and getattr(src, "grad", None) is not None

    def handle(self, call: Call) -> Any:
        dest, src = call.argument("dest", DEST), call.argument("src", SRC)
        why = _out_of_reach(dest, src)
        if why:
            self.emit(
                f"a wp.copy recorded on a tape keeps Warp's wrong adjoint: {why}",
                action="not_fixed",
                callsite=call.callsite,
                target=str(call.target),
            )
            return call.proceed()
        if not self.report(
            call,
            "replace_adjoint",
            "a wp.copy recorded on a tape gets an adjoint that assigns the destination's "
            "gradient to the source's; "
            + ("recorded with" if self.mode == "fix" else "fix records")
            + " one that adds it",
            shape=list(src.shape),
        ):
            return call.proceed()
        return self._copy_unrecorded(call, dest, src)

    def _copy_unrecorded(self, call: Call, dest: Any, src: Any) -> Any:
        runtime = self._context.runtime
        tape = runtime.tape
        runtime.tape = None
        try:
            result = call.proceed()
        finally:
            runtime.tape = tape
        offsets = (
            call.argument("dest_offset", DEST_OFFSET, 0),
            call.argument("src_offset", SRC_OFFSET, 0),
            call.argument("count", COUNT, 0) or src.size,
        )
        tape.record_func(backward=lambda: _add_adjoint(dest, src, *offsets), arrays=[dest, src])
        return result


def _out_of_reach(dest: Any, src: Any) -> str:
    """Why the guard cannot do this copy's adjoint exactly ("" where it can)."""
    if dest.device != src.device:
        return "the arrays are on different devices"
    if getattr(dest.device, "is_capturing", False):
        return "a CUDA graph is being captured, and the remedy synchronizes the device"
    if not (dest.is_contiguous and src.is_contiguous):
        return "an array is not contiguous"
    if dest.dtype is not src.dtype:
        return "the arrays' dtypes differ"
    if dest.ptr and src.ptr:
        dest_end = dest.ptr + getattr(dest, "capacity", 0)
        if src.ptr < dest_end and dest.ptr < src.ptr + getattr(src, "capacity", 0):
            return "the arrays' memory overlaps"
    return ""


def _add_adjoint(dest: Any, src: Any, dest_offset: int, src_offset: int, count: int) -> None:
    """``src.grad[window] += dest.grad[window]``, then ``dest.grad[window] = 0``."""
    adj_dest, adj_src = dest.grad, src.grad
    if adj_dest is None or adj_src is None:
        return
    if adj_dest.device.is_cpu:
        to, done = _numpy_view, None
    else:
        warp, torch = sys.modules["warp"], __import__("torch")
        warp.synchronize_device(adj_dest.device)
        to, done = warp.to_torch, torch
    dest_view, src_view = to(adj_dest), to(adj_src)
    dest_window = dest_view.reshape(adj_dest.size, -1)[dest_offset : dest_offset + count]
    src_window = src_view.reshape(adj_src.size, -1)[src_offset : src_offset + count]
    src_window += dest_window
    if not getattr(dest, "retain_grad", False):
        dest_window[...] = 0
    if done is not None:
        done.cuda.synchronize(adj_dest.device.ordinal)


def _numpy_view(array: Any) -> Any:
    return array.numpy()  # a view of a host array's memory


GUARD = WarpCopyAdjoint
