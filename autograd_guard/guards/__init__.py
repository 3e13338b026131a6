"""The built-in guards, one module each. Each module reads as the bug report it answers."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from autograd_guard._guard import Guard

BUILTIN = ("grad_mode", "pytorch3d_taubin", "warp_torch_args", "gsplat_means2d", "ipex_xpu")

_registered: list[type[Guard]] = []


def builtin() -> list[type[Guard]]:
    guards = []
    for name in BUILTIN:
        module_name = f"autograd_guard.guards.{name}"
        __import__(module_name)  # importlib.import_module would import importlib first
        guards.append(sys.modules[module_name].GUARD)
    return guards


def available() -> list[type[Guard]]:
    """Every guard this process can use."""
    return builtin() + list(_registered)


def register(guard: type[Guard]) -> None:
    """Add a guard class (takes effect at the next ``install``)."""
    if guard not in _registered:
        _registered.append(guard)


def unregister(guard: type[Guard]) -> None:
    if guard in _registered:
        _registered.remove(guard)
