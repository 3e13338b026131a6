"""pytest plugin: ``pytest --autograd-guard=strict|fix|observe`` and the
``autograd_guard_events`` fixture. Loaded in every pytest run, so it imports nothing
until asked."""

from __future__ import annotations

import os
import sys

import pytest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

MODES = ("observe", "fix", "strict")  # "off" is not a way to run a guarded session


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("autograd-guard")
    group.addoption(
        "--autograd-guard",
        choices=MODES,
        default=None,
        dest="autograd_guard",
        help="guard the test session with the project's policy in this mode "
        "(strict turns every intervention into a test failure)",
    )


def pytest_configure(config: pytest.Config) -> None:
    from autograd_guard._common import STATE
    from autograd_guard._common import environment as _environment

    if _environment.requested() and not STATE.started:
        # Set, yet the .pth never ran: an installer that drops it (kvcached#470, uv#19258).
        sys.stderr.write(
            "autograd-guard: AUTOGRAD_GUARD is set but autograd_guard.pth was not processed, "
            "so nothing is guarded; reinstall without --editable, run under "
            "'autograd-guard run --', or pass --autograd-guard=MODE\n"
        )
    mode = config.getoption("autograd_guard", None)
    if mode:
        from autograd_guard._engine import engine as _engine
        from autograd_guard._policy import policy as _policy
        from autograd_guard.guards import available

        environ = {**os.environ, "AUTOGRAD_GUARD": mode}
        _engine.install(_policy.load(None, available(environ), environ=environ))
        config._autograd_guard_installed = True  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    if getattr(config, "_autograd_guard_installed", False):
        from autograd_guard._engine import engine as _engine

        _engine.uninstall()


def pytest_report_header(config: pytest.Config) -> str | None:
    mode = config.getoption("autograd_guard", None)
    return f"autograd-guard: {mode}" if mode else None


@pytest.fixture
def autograd_guard_events() -> Iterator[list[dict[str, Any]]]:
    """The autograd-guard events logged during the test, as dicts."""
    from autograd_guard.testing import capture_events

    with capture_events() as events:
        yield events
