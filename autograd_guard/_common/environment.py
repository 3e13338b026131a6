"""Every environment variable autograd-guard reads, in one place (it imports only ``os``).

The ``.pth`` line repeats the on/off test inline, so that with the variable unset nothing
of the package is imported; a start with it set reads the cache folder through
``_common``'s own module (``cache_folder``, ``OFF_VALUES``, re-exported here), so that it
does not import this one.
"""

from __future__ import annotations

import os
import sys

from autograd_guard._common import OFF_VALUES as OFF_VALUES  # the start reads them there
from autograd_guard._common import VARIABLES as VARIABLES  # the names below, in one tuple
from autograd_guard._common import cache_folder as cache_folder  # where callers find it

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Literal

    Mode = Literal["off", "observe", "fix", "strict"]  # what a guard does at a risky call

AUTOGRAD_GUARD = "AUTOGRAD_GUARD"
"""``1``/``on``/``true``/``yes``: on, with the policy's modes; ``observe``, ``fix``,
``strict`` or ``off``: on, overriding every mode; unset, empty, ``0``, ``off``: off."""

AUTOGRAD_GUARD_POLICY = "AUTOGRAD_GUARD_POLICY"
"""A policy file path, or the name of a shipped preset."""

AUTOGRAD_GUARD_DISABLE = "AUTOGRAD_GUARD_DISABLE"
"""Comma-separated guard names to switch off, or ``*``."""

AUTOGRAD_GUARD_LOG = "AUTOGRAD_GUARD_LOG"
"""``stderr``, ``logging`` (in any case), or a file path for JSON lines."""

AUTOGRAD_GUARD_CACHE = "AUTOGRAD_GUARD_CACHE"
"""``off`` stops caching parsed policies and the entry-point list on disk."""

MODES: tuple[Mode, ...] = ("off", "observe", "fix", "strict")
LOG_KEYWORDS = ("stderr", "logging")  # in any case; any other value is a file path
ON_VALUES = frozenset({"1", "true", "on", "yes"})


def _read(environ: Mapping[str, str] | None, name: str) -> str:
    return (os.environ if environ is None else environ).get(name, "").strip()


def requested(environ: Mapping[str, str] | None = None) -> bool:
    """True when the environment asks for the guard."""
    return _read(environ, AUTOGRAD_GUARD).lower() not in OFF_VALUES


def switch(environ: Mapping[str, str] | None = None) -> str:
    """``AUTOGRAD_GUARD`` as written, lower-case (for validation and messages)."""
    return _read(environ, AUTOGRAD_GUARD).lower()


def as_mode(value: object) -> Mode | None:
    """``value`` as a mode, where it names one (the typed reading of a mode)."""
    for mode in MODES:
        if value == mode:
            return mode
    return None


def mode_override(environ: Mapping[str, str] | None = None) -> Mode | None:
    """The mode ``AUTOGRAD_GUARD`` imposes on every guard, if it names one."""
    return as_mode(switch(environ))


def disabled(environ: Mapping[str, str] | None = None) -> set[str]:
    """Guard names switched off by ``AUTOGRAD_GUARD_DISABLE`` (may hold ``*``)."""
    return {n.strip() for n in _read(environ, AUTOGRAD_GUARD_DISABLE).split(",") if n.strip()}


def policy_name(environ: Mapping[str, str] | None = None) -> str:
    return _read(environ, AUTOGRAD_GUARD_POLICY)


def log(environ: Mapping[str, str] | None = None) -> str | None:
    value = _read(environ, AUTOGRAD_GUARD_LOG)
    return value.lower() if value.lower() in LOG_KEYWORDS else value or None


def rank() -> int | None:
    """The distributed rank, for events: ``torch.distributed``'s once a process group is
    initialised (``mp.spawn``, SLURM and MPI launchers pass it to
    ``init_process_group``), and the last one seen after ``destroy_process_group()``
    (events at exit); else torchrun's ``RANK``."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            _LAST_RANK[:] = [int(dist.get_rank())]
            return _LAST_RANK[0]
    except Exception:
        pass
    if _LAST_RANK:
        return _LAST_RANK[0]
    value = os.environ.get("RANK", "")
    return int(value) if value.strip().isdigit() else None


_LAST_RANK: list[int] = []  # the rank while a process group was initialised
