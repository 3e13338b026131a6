"""Helpers for testing code that runs under autograd-guard (like ``structlog.testing``)."""

from __future__ import annotations

import contextlib

from autograd_guard._engine import engine as _engine
from autograd_guard._events import events as _events

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any

    from autograd_guard._policy.policy import Policy

__all__ = ["capture_events", "guarded"]


@contextlib.contextmanager
def capture_events(reset: bool = True) -> Iterator[list[dict[str, Any]]]:
    """Collect the events logged inside the block (one per guard, action and call site).

    With ``reset``, call sites seen before the block count as new again.
    """
    events: list[dict[str, Any]] = []
    if reset:
        _events.reset()
    _events.add_listener(events.append)
    try:
        yield events
    finally:
        _events.remove_listener(events.append)


@contextlib.contextmanager
def guarded(policy: Policy | str | Mapping[str, Any] | None = None) -> Iterator[None]:
    """Install the guard for the block, then restore every patched object."""
    _engine.install(policy)
    try:
        yield
    finally:
        _engine.uninstall()
