"""pytest plugin: ``pytest --autograd-guard=strict|fix|observe`` and the
``autograd_guard_events`` fixture. Loaded in every pytest run, so it imports nothing
until asked."""

from __future__ import annotations

import os
import sys

import pytest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Generator, Iterator
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Each test is a run of its own: after its call, what the exit would say of it is said
    (a lost gradient in a test shorter than ``lost_steps``); in strict, such a finding fails
    that test, as the finding's own exit status would fail a program."""
    outcome = yield
    if call.when != "call" or not getattr(item.config, "_autograd_guard_installed", False):
        return
    from autograd_guard._engine import engine as _engine

    found = _engine.settle()
    if found:
        _fail(outcome.get_result(), found)


def _fail(report: pytest.TestReport, found: list[dict[str, Any]]) -> None:
    lines = ["autograd-guard strict: a finding at the end of this test (a program would end "]
    lines[0] += "with exit status 3):"
    for event in found:
        lines.append(f"  [{event['guard']}/{event['action']}] {event['event']}")
        lines.append(f"    at {event['callsite']}")
        if event.get("remedy"):
            lines.append(f"    remedy: {event['remedy']}")
    text = "\n".join(lines)
    if report.failed:  # the test failed already: the finding is told beside its failure
        report.sections.append(("autograd-guard", text))
    else:
        report.outcome = "failed"
        report.longrepr = text


def pytest_sessionfinish(session: pytest.Session) -> None:
    """What ran outside any test (a fixture's teardown, a module's code) is settled last;
    a strict finding there fails the session with the exit status the variable gives."""
    if getattr(session.config, "_autograd_guard_installed", False):
        from autograd_guard._engine import engine as _engine

        if _engine.settle() and not session.exitstatus:
            session.exitstatus = 3


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
