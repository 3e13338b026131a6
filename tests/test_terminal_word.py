"""The run's last line on a terminal (``_boot.word``), in this process: said where stderr
is a terminal and nothing was reported, by the main process only. Through the wheel's
``.pth`` on a pseudo-terminal: tests/test_policy_autoload.py."""

from __future__ import annotations

import io
import sys

import pytest
import torch

import autograd_guard
from autograd_guard._boot import word
from autograd_guard._events import events as _events


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch):
    """Puts a terminal on ``sys.stderr`` when called: pytest sets its own capture stream
    there between a fixture and the test."""
    autograd_guard.install("default")
    _events.reset(totals=True)

    def on_terminal() -> Terminal:
        stream = Terminal()
        monkeypatch.setattr(sys, "stderr", stream)
        return stream

    return on_terminal


def steps(count: int) -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(count):
        optimizer.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()


def test_the_line_names_mode_policy_and_steps(terminal):
    terminal()
    steps(3)
    assert word.line() == (
        "autograd-guard: on (mode fix, policy preset default); 3 optimizer steps watched; "
        "nothing to report"
    )


def test_no_line_where_something_was_reported_or_no_terminal(terminal, monkeypatch):
    terminal()
    steps(1)
    _events.emit("x", guard="grad_mode", action="enable_grad", callsite="a.py:1")
    assert word.line() is None  # the summary is the last line
    _events.reset(totals=True)
    assert word.line() is not None
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert word.line() is None


def test_only_the_main_process_says_it(terminal, monkeypatch):
    import multiprocessing

    terminal()
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    assert word.line() is None
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)
    monkeypatch.setenv("RANK", "1")
    assert word.line() is None
    monkeypatch.setenv("RANK", "0")
    assert word.line() is not None


def test_grad_health_off_is_said(terminal):
    autograd_guard.install({"disable": ["grad_health"]})
    _events.reset(totals=True)  # late_patch notes of libraries earlier tests imported
    terminal()
    assert word.line().endswith("grad_health off; nothing to report")
