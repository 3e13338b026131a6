"""What ``warp_tape`` keeps of a recording tape: for each array its launches read, the
reads and the contents it had before each write; and, at ``backward()``, the reads whose
contents changed, how to name them, and the inputs each adjoint is given back."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

RECORDED_INPUTS = 3  # in a recorded launch: [kernel, dim, max_blocks, inputs, outputs, ...]


class Watched:
    """An array read by recorded launches of one tape: the contents it had before each
    write (``versions``), and each read as (launch index, version, input position, site)."""

    __slots__ = ("array", "reads", "versions")

    def __init__(self, array: Any) -> None:
        self.array = array
        self.versions: list[tuple[Any, str, str, bool]] = []  # (copy, write, site, exposed)
        self.reads: list[tuple[int, int, int, tuple[str, int]]] = []


def fresh(watched: Watched) -> bool:
    """The array was read since its last write: the next write must copy it first."""
    return watched.reads[-1][1] == len(watched.versions)


def stale(watched: Watched) -> list[tuple[Watched, int, int, int, tuple[str, int]]]:
    """Each read whose contents have changed since: (watched, launch, version, position,
    site). A ``.numpy()`` view that was not written through changed nothing."""
    versions = watched.versions
    changed = []
    for version, (copy, _, _, exposed) in enumerate(versions):
        after = versions[version + 1][0] if version + 1 < len(versions) else watched.array
        changed.append(not exposed or not (copy.numpy() == after.numpy()).all())
    return [
        (watched, index, version, position, site)
        for index, version, position, site in watched.reads
        if any(changed[version:])
    ]


def replay_plan(launches: list[Any], stale: list[Any]) -> dict[int, list[dict[int, Any]]]:
    """For each recorded launch's inputs list, in backward's (reverse) order, the inputs
    to give its adjoint: ``{position: the copy of what it read}``."""
    given: dict[int, dict[int, Any]] = {}
    for watched, index, version, position, _ in stale:
        given.setdefault(index, {})[position] = watched.versions[version][0]
    lists = {id(launches[index][RECORDED_INPUTS]) for index in given if index < len(launches)}
    plan: dict[int, list[dict[int, Any]]] = {}
    for index in reversed(range(len(launches))):
        entry = launches[index]
        if not callable(entry) and id(entry[RECORDED_INPUTS]) in lists:
            plan.setdefault(id(entry[RECORDED_INPUTS]), []).append(given.get(index, {}))
    return plan


def describe(launches: list[Any], watched: Watched, *read: Any) -> dict[str, Any]:
    index, version, position, site = read
    kernel = launches[index][0] if index < len(launches) else None
    params = getattr(getattr(kernel, "adj", None), "args", ())
    _, write, written_at, _ = watched.versions[version]
    array = watched.array
    return {
        "argument": params[position].label if position < len(params) else str(position),
        "kernel": getattr(kernel, "key", "?"),
        "read_at": f"{site[0]}:{site[1]}",
        "written_by": write,
        "written_at": written_at,
        "shape": list(array.shape),
        "dtype": getattr(array.dtype, "__name__", str(array.dtype)),
    }


def user_frame() -> tuple[str, int]:
    """The file name and line of the launch's caller, outside Warp and this package."""
    frame = sys._getframe(3)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(
        ("warp.", "autograd_guard.", "wrapt")
    ):
        frame = frame.f_back
    return frame.f_code.co_filename.rpartition("/")[2], frame.f_lineno
