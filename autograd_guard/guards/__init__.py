"""The built-in guards, one module each. Each module reads as the bug report it answers."""

from __future__ import annotations

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from autograd_guard._guard import Guard

BUILTIN = ("grad_mode",)


def builtin() -> list[type[Guard]]:
    return [importlib.import_module(f"autograd_guard.guards.{name}").GUARD for name in BUILTIN]


def available() -> list[type[Guard]]:
    """Every guard this process can use."""
    return builtin()
