"""What reaches a log: no tensor data at any depth, each event at its own level through
``logging``, call sites normalised."""

from __future__ import annotations

import json
import logging
import os

import torch

from autograd_guard._events import events as _events


def test_tensors_nested_in_an_event_are_described_not_printed(tmp_path):
    log = tmp_path / "events.jsonl"
    _events.configure(str(log))
    secret = torch.tensor([123456.0, 654321.0])
    try:
        _events.emit(
            "nested",
            guard="g",
            action="a",
            callsite="x.py:1",
            changes=[{"before": secret, "inner": (secret, {"deep": [secret]})}],
        )
    finally:
        _events.configure(None)
    text = log.read_text()
    assert "123456" not in text and "654321" not in text
    record = json.loads(text)
    assert record["changes"][0]["before"] == "<Tensor shape=(2,) torch.float32>"
    assert record["changes"][0]["inner"][1]["deep"] == ["<Tensor shape=(2,) torch.float32>"]


def test_the_logging_sink_uses_each_events_own_level(caplog):
    _events.configure("logging")
    try:
        with caplog.at_level(logging.DEBUG, logger="autograd_guard"):
            _events.emit("a note", guard="g", action="n", callsite="c:1", level="info")
            _events.emit("broken", guard="g", action="e", callsite="c:2", level="error")
    finally:
        _events.configure(None)
    levels = [(r.levelname, r.getMessage().split("]")[0]) for r in caplog.records]
    assert levels == [("INFO", "[g/n"), ("ERROR", "[g/e")]
    assert not any("autograd-guard warning" in r.getMessage() for r in caplog.records)


def test_call_sites_are_normalised(make_module, tmp_path):
    import autograd_guard
    from autograd_guard.testing import capture_events

    make_module("norm_stage", "def stage(x):\n    return x\n")
    sub = tmp_path / "sub"
    sub.mkdir()
    caller = sub / ".." / "caller_script.py"
    (tmp_path / "caller_script.py").write_text("def call(f, x):\n    return f(x)\n")
    autograd_guard.install({"rules": [{"target": "norm_stage:stage", "action": "enable_grad"}]})
    import norm_stage

    namespace: dict[str, object] = {}
    exec(compile(caller.read_text(), str(caller), "exec"), namespace)
    with torch.no_grad(), capture_events() as events:
        namespace["call"](norm_stage.stage, torch.ones(1))
    assert events[0]["callsite"] == f"{os.path.normpath(caller)}:2"
    assert "/../" not in events[0]["callsite"]


def test_the_stderr_sink_escapes_every_non_printable_character(capsys):
    # Issue 19 item 9: a parameter name (a ModuleDict key) that rewrites the terminal line.
    name = "head\r\x1b[2Kall gradients healthy\u202e"
    _events.configure("stderr")
    try:
        _events.emit(f"non-finite gradient in {name}", guard="g", action="a", callsite="c:1")
        _events.emit("note", guard="g", action="b", callsite=f"/tmp/x\x1b]0;t\x07/y.py:{name}")
    finally:
        _events.configure(None)
    err = capsys.readouterr().err
    assert err.isprintable() is False and err.count("\n") == 2  # only the line ends
    assert all(line.isprintable() for line in err.splitlines())
    assert "head\\r\\x1b[2Kall gradients healthy\\u202e" in err
    assert "/tmp/x\\x1b]0;t\\x07/y.py" in err
