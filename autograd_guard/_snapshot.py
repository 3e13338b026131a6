"""Snapshots of tensors, to find and undo writes that bypass autograd.

Kernels that write through raw pointers (Warp, CUDA extensions, NumPy views) leave a
tensor's version counter alone, so only a copy shows their writes. Shared by every guard
that protects a caller's inputs.
"""

from __future__ import annotations

from typing import Any


class Change:
    """One tensor that was written to: what, how much, and never the values themselves."""

    __slots__ = ("dtype", "max_abs_change", "name", "shape")

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str, max_abs_change: float):
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.max_abs_change = max_abs_change

    def describe(self) -> dict[str, Any]:
        return {
            "argument": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "max_abs_change": self.max_abs_change,
        }


class Snapshot:
    """Copies taken now; ``changes()`` compares, ``restore()`` puts the exact bytes back."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, Any, Any]] = []

    def add(self, name: str, tensor: Any) -> None:
        self.entries.append((name, tensor, tensor.detach().clone()))

    def changes(self) -> list[Change]:
        found = []
        for name, tensor, copy in self.entries:
            current = tensor.detach()
            differs = current.ne(copy)
            if current.is_floating_point() or current.is_complex():
                differs &= ~(current.isnan() & copy.isnan())  # NaN where NaN was is no change
            if bool(differs.any()):
                delta = (current.double() - copy.double()).abs()[differs]
                found.append(
                    Change(name, tuple(tensor.shape), str(tensor.dtype), float(delta.max()))
                )
        return found

    def restore(self, changes: list[Change]) -> None:
        names = {c.name for c in changes}
        for name, tensor, copy in self.entries:
            if name in names:
                import torch

                with torch.no_grad():
                    tensor.copy_(copy)
