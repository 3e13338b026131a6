"""Snapshots of tensors, to find and undo writes that bypass autograd.

Kernels that write through raw pointers (Warp, CUDA extensions, NumPy views) leave a
tensor's version counter alone, so only a copy shows their writes. Shared by every guard
that protects a caller's inputs.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Change:
    """One tensor that was written to: what, how much, and never the values themselves;
    ``version_moved``: the write went through a torch op (the version counter moved)."""

    __slots__ = ("dtype", "max_abs_change", "name", "shape", "version_moved")

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: str,
        max_abs_change: float,
        version_moved: bool = False,
    ):
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.max_abs_change = max_abs_change
        self.version_moved = version_moved

    def describe(self) -> dict[str, Any]:
        described = {
            "argument": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "max_abs_change": self.max_abs_change,
        }
        if self.version_moved:
            described["version_moved"] = True
        return described


class Snapshot:
    """Copies taken now; ``changes()`` compares, ``restore()`` puts the exact bytes back
    without moving the version counter, so that the caller's graphs stay usable."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, Any, Any, int]] = []

    def add(self, name: str, tensor: Any) -> None:
        self.entries.append((name, tensor, tensor.detach().clone(), _version(tensor)))

    def changes(self) -> list[Change]:
        found = []
        for name, tensor, copy, version in self.entries:
            current = tensor.detach()
            differs = current.ne(copy)
            if current.is_floating_point() or current.is_complex():
                differs &= ~(current.isnan() & copy.isnan())  # NaN where NaN was is no change
            if bool(differs.any()):
                delta = (current.double() - copy.double()).abs()[differs]
                moved = _version(tensor) != version
                shape, dtype = tuple(tensor.shape), str(tensor.dtype)
                found.append(Change(name, shape, dtype, float(delta.max()), moved))
        return found

    def restore(self, changes: list[Change]) -> None:
        import torch

        names = {c.name for c in changes}
        for name, tensor, copy, _ in self.entries:
            if name not in names:
                continue
            if tensor.is_inference():  # no version counter; writable in inference mode only
                with torch.inference_mode():
                    tensor.copy_(copy)
            else:  # .data has a counter of its own: a copy_() there leaves the caller's alone
                with torch.no_grad():
                    tensor.data.copy_(copy)


def _version(tensor: Any) -> int:
    """The version counter (inference tensors have none)."""
    return -1 if tensor.is_inference() else int(tensor._version)
