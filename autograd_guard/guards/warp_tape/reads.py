"""What ``warp_tape`` keeps of a recording tape: the arrays its recorded launches read
since their last write, and the contents an array had before each write; at
``backward()``, the reads (worked out from Warp's own record, ``tape.launches``) whose
contents changed since, how to name them, and the inputs each adjoint is given."""

from __future__ import annotations

import os
import weakref

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType, FrameType
    from typing import Any

    # (launch index, input position, array, version: how many writes came before the read)
    Read = tuple[int, int, Any, int]
    # (copy, the write, (code, instruction) of its caller, a .numpy() view, the index of
    # the launch it came before)
    Version = tuple[Any, str, tuple[CodeType, int], bool, int]

OWN = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
RECORDED_INPUTS = 3  # in a recorded launch: [kernel, dim, max_blocks, inputs, outputs, ...]


class TapeReads:
    """One recording tape's reads: ``fresh`` (the arrays its recorded launches read since
    their last write, by id: the next write copies them first) and ``versions`` (by id,
    the contents before each write). Which launch read what is Warp's own record, read
    at ``backward()`` from ``start``, the first launch recorded while the guard watched."""

    __slots__ = ("fresh", "start", "tape", "versions")

    def __init__(self, tape: Any, gone: Callable[[Any], None]) -> None:
        self.tape = weakref.ref(tape, gone)  # ``gone`` runs if the tape dies first
        self.start = len(tape.launches)
        self.fresh: dict[int, Any] = {}
        self.versions: dict[int, list[Version]] = {}

    def note(self, inputs: Any, array: Any, read: Any) -> None:
        """The ``wp.array`` values of ``inputs`` at the positions in ``read`` (those its
        kernel reads) are read by a recorded launch."""
        fresh, count = self.fresh, len(inputs)
        for position in read:
            if position < count:
                value = inputs[position]
                if type(value) is array or isinstance(value, array):
                    fresh[id(value)] = value

    def reads(self, launches: list[Any], read_by: Callable[[Any], Any]) -> list[Read]:
        """The reads by the recorded ``launches`` (``read_by(kernel)``: the positions its
        kernel reads) of the arrays written since they were read."""
        found: list[Read] = []
        versions = self.versions
        for index in range(self.start, len(launches)):
            entry = launches[index]
            if callable(entry) or not isinstance(entry, list):
                continue  # a tape.record_func() callback
            inputs = entry[RECORDED_INPUTS] or ()
            for position in read_by(entry[0]):
                written = versions.get(id(inputs[position])) if position < len(inputs) else None
                if written:
                    before = sum(1 for version in written if version[4] <= index)
                    found.append((index, position, inputs[position], before))
        return found

    def stale(self, launches: list[Any], read_by: Callable[[Any], Any]) -> list[Read]:
        """The reads whose contents have changed since. A ``.numpy()`` view that was not
        written through changed nothing."""
        if not self.versions:
            return []  # nothing was written after a read
        log = self.reads(launches, read_by)
        arrays = {id(read[2]): read[2] for read in log}
        changed: dict[int, list[bool]] = {}
        for key, versions in self.versions.items():
            if key not in arrays:
                continue
            after = [v[0] for v in versions[1:]] + [arrays[key]]
            changed[key] = [
                not exposed or not (copy.numpy() == later.numpy()).all()
                for (copy, _, _, exposed, _), later in zip(versions, after, strict=True)
            ]
        return [read for read in log if any(changed.get(id(read[2]), ())[read[3] :])]


def changes_any(live: list[TapeReads], arrays: Any) -> bool:
    """Whether a write to ``arrays`` changes what a recorded launch read (a copy is due)."""
    for array in arrays:  # loops, not any(): a generator costs more here
        key = id(array)
        for reads in live:
            if key in reads.fresh:
                return True
    return False


def outside(frame: FrameType) -> FrameType:
    """The first frame at or above ``frame`` outside this package (its wrappers and
    proxies): the user's, or the library's that called it."""
    while frame.f_code.co_filename.startswith(OWN) and frame.f_back is not None:
        frame = frame.f_back
    return frame


def caller(frame: FrameType) -> tuple[CodeType, int]:
    """Where ``outside(frame)`` is; a line is worked out from it only for a report."""
    frame = outside(frame)
    return frame.f_code, frame.f_lasti


def caller_record(frame: FrameType) -> dict[str, Any]:
    """Warp's record of a launch's caller for ``outside(frame)``, as it is now."""
    frame = outside(frame)
    code = frame.f_code
    return {"file": code.co_filename, "lineno": frame.f_lineno, "func": code.co_name}


def mend_caller(entry: Any, caller: dict[str, Any]) -> None:
    """Warp records the frame that called its ``launch`` as a launch's caller (its tape
    visualisation names it): where that was a wrapper of this package, ``caller`` (the
    first frame above it outside this package, when it called) takes its place."""
    metadata = entry[-1] if isinstance(entry, list) and entry else None
    if not isinstance(metadata, dict):
        return
    recorded = metadata.get("caller")
    if isinstance(recorded, dict) and str(recorded.get("file", "")).startswith(OWN):
        metadata["caller"] = caller


def line(site: tuple[CodeType, int]) -> str:
    code, offset = site
    number = code.co_firstlineno
    for start, end, found in code.co_lines():
        if start <= offset < end and found is not None:
            number = found
    return f"{os.path.basename(code.co_filename)}:{number}"


def replay_plan(
    launches: list[Any], reads: TapeReads, stale: list[Read]
) -> dict[int, list[dict[int, Any]]]:
    """For each recorded launch's inputs list, in backward's (reverse) order, the inputs
    to give its adjoint: ``{position: the copy of what it read}``."""
    given: dict[int, dict[int, Any]] = {}
    for index, position, array, version in stale:
        given.setdefault(index, {})[position] = reads.versions[id(array)][version][0]
    lists = {id(launches[index][RECORDED_INPUTS]) for index in given if index < len(launches)}
    plan: dict[int, list[dict[int, Any]]] = {}
    for index in reversed(range(len(launches))):
        entry = launches[index]
        if not callable(entry) and id(entry[RECORDED_INPUTS]) in lists:
            plan.setdefault(id(entry[RECORDED_INPUTS]), []).append(given.get(index, {}))
    return plan


def describe(launches: list[Any], reads: TapeReads, read: Read) -> dict[str, Any]:
    index, position, array, version = read
    kernel, metadata = launches[index][0], launches[index][-1]
    params = getattr(getattr(kernel, "adj", None), "args", ())
    _, write, written_at, _, _ = reads.versions[id(array)][version]
    return {
        "argument": params[position].label if position < len(params) else str(position),
        "kernel": getattr(kernel, "key", "?"),
        "read_at": recorded_line(metadata, index),
        "written_by": write,
        "written_at": line(written_at),
        "shape": list(array.shape),
        "dtype": getattr(array.dtype, "__name__", str(array.dtype)),
    }


def recorded_line(metadata: Any, index: int) -> str:
    """Where Warp recorded a launch's caller (``file:line``; mended where it was a
    wrapper of this package)."""
    caller = metadata.get("caller") if isinstance(metadata, dict) else None
    if isinstance(caller, dict) and "file" in caller and "lineno" in caller:
        return f"{os.path.basename(str(caller['file']))}:{caller['lineno']}"
    return f"the tape's launch {index}"


def message(described: list[dict[str, Any]], fixed: bool) -> str:
    """The event's text: the first overwritten read, and how many more."""
    first = described[0]
    more = f" and {len(described) - 1} more" if len(described) > 1 else ""
    return (
        f"{first['kernel']}'s input {first['argument']!r} (read at {first['read_at']}) "
        f"was overwritten by {first['written_by']} at {first['written_at']}{more} before "
        "tape.backward(), which uses the arrays' current contents; "
        + ("each launch was given" if fixed else "fix gives each launch")
        + " the contents it read"
    )
