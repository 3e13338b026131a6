"""Nothing the guard does can block the program: an event sink that is a FIFO with no
reader, a log path that cannot be written, forks while other threads log."""

from __future__ import annotations

import os

import pytest
from helpers import run_python

STAGE_UNDER_NO_GRAD = """
import torch
from mesh_reconstruction.recon import reconstruct_stage1
with torch.no_grad():
    print("loss", round(reconstruct_stage1(torch.ones(3))[1], 3))
"""


def test_a_fifo_without_a_reader_as_log_does_not_block(guard_python, project):
    fifo = project / "events.fifo"
    os.mkfifo(fifo)
    result = run_python(
        guard_python, STAGE_UNDER_NO_GRAD, project, AUTOGRAD_GUARD="1", AUTOGRAD_GUARD_LOG=str(fifo)
    )  # run_python's timeout fails the test if the program hangs
    assert result.stdout.startswith("loss ")
    [notice] = [line for line in result.stderr.splitlines() if "cannot write events" in line]
    assert f"{str(fifo)!r} (set by AUTOGRAD_GUARD_LOG)" in notice
    # the event still reaches stderr, as the readable line of log = "stderr", not JSON
    assert ": [grad_mode/enable_grad] " in result.stderr
    assert '"action"' not in result.stderr


@pytest.mark.parametrize("kind", ["missing folder", "directory", "read-only"])
def test_an_unwritable_log_falls_back_to_stderr_naming_path_and_source(guard_python, project, kind):
    if kind == "missing folder":
        path = project / "no" / "such" / "events.jsonl"
    elif kind == "directory":
        path = project / "a_folder"
        path.mkdir()
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes read-only files")
        path = project / "events.jsonl"
        path.write_text("")
        path.chmod(0o444)
    policy = project / "autograd_guard.toml"
    policy.write_text(f'extends = "unique3d"\nlog = "{path}"\n')
    result = run_python(guard_python, STAGE_UNDER_NO_GRAD, project, AUTOGRAD_GUARD="1")
    [notice] = [line for line in result.stderr.splitlines() if "cannot write events" in line]
    assert f"{str(path)!r} (set by the 'log' key of {policy})" in notice
    assert ": [grad_mode/enable_grad] " in result.stderr
    assert '"action"' not in result.stderr
    assert "could not log an event" not in result.stderr


FORK_STORM = """
import os, sys, threading, time
import torch
import autograd_guard
RULE = {"target": "mesh_reconstruction.recon:tiny", "action": "enable_grad"}
autograd_guard.install({"mode": "observe", "log": LOG, "rules": [RULE]})
from mesh_reconstruction import recon

stop = False
def spin():
    n = 0
    while not stop:
        with torch.no_grad():
            recon.tiny(n)  # risky: takes the event lock on every call
        n += 1
threading.Thread(target=spin, daemon=True).start()
time.sleep(0.2)
hung = 0
for i in range(200):
    pid = os.fork()
    if pid == 0:
        with torch.no_grad():
            recon.tiny(-1)
        os._exit(0)
    deadline = time.monotonic() + 10
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            hung += 1
            break
        time.sleep(0.001)
stop = True
print("hung", hung)
"""


def test_forking_under_a_thread_that_logs_never_hangs_a_child(guard_python, project):
    (project / "mesh_reconstruction" / "recon.py").write_text("def tiny(n):\n    return n\n")
    log = project / "events.jsonl"
    result = run_python(guard_python, f"LOG = {str(log)!r}\n{FORK_STORM}", project)
    assert result.stdout.strip() == "hung 0", result.stderr
