"""What a newcomer meets at start, through the built wheel's ``.pth`` in child interpreters:
a typo never switches the net off (the policy is partly used, the warning said at start
and again at exit), a near miss of a log keyword keeps events on stderr, the policy is
found beside the program, the first event names it, a terminal gets one last line, and
``run`` refuses what it cannot guard."""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess

import pytest
import wheelenv
from helpers import ROOT, run_python

NAN = (ROOT / "examples" / "nan_gradient.py").read_text()
PROGRAM_LINE = "autograd-guard: said at start:"


def run_file(python, script, cwd, *args, **env):
    return subprocess.run(
        [str(python), *args, str(script)],
        cwd=cwd,
        env=wheelenv.clean_environ(XDG_CACHE_HOME=str(cwd / ".xdg-cache"), **env),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("policy", "env"),
    [
        ('mdoe = "observe"\n', {"AUTOGRAD_GUARD": "1"}),
        ("", {"AUTOGRAD_GUARD": "fxi"}),
        ("", {"AUTOGRAD_GUARD": "ture"}),
        ('mode = "fix"\n', {"AUTOGRAD_GUARD": "obsreve"}),
        ('mode = "fix"\nx = [\n', {"AUTOGRAD_GUARD": "1"}),  # not TOML: the default preset
    ],
)
def test_a_typo_never_switches_the_net_off(guard_python, tmp_path, policy, env):
    """The NaN example ends with finite weights (its steps skipped, as in fix mode), and
    the warning is said at start and again at exit."""
    (tmp_path / "autograd_guard.toml").write_text(policy)
    script = tmp_path / "nan_gradient.py"
    script.write_text(NAN)
    assert "weights finite: False" in run_file(guard_python, script, tmp_path).stdout
    result = run_file(guard_python, script, tmp_path, **env)
    assert "weights finite: True" in result.stdout, result.stderr
    lines = result.stderr.splitlines()
    headline = lines[0]
    assert "did you mean" in lines[1] or "invalid TOML" in lines[1]
    assert ("running the shipped default preset" in headline) == ("x = [" in policy)
    assert ("the rest applies and the guard is on" in headline) != ("x = [" in policy)
    assert lines[lines.index(PROGRAM_LINE) + 1] == f"  {headline}"
    if "AUTOGRAD_GUARD" in env and env["AUTOGRAD_GUARD"] != "1":
        assert "ignored: the guard is on in the policy's modes (mode fix)" in lines[1]


def test_a_typo_in_the_disable_variable_leaves_that_guard_on(guard_python, tmp_path):
    script = tmp_path / "nan_gradient.py"
    script.write_text(NAN)
    result = run_file(
        guard_python, script, tmp_path, AUTOGRAD_GUARD="1", AUTOGRAD_GUARD_DISABLE="grad_helth"
    )
    assert "weights finite: True" in result.stdout
    warning = (
        "autograd-guard: AUTOGRAD_GUARD_DISABLE: unknown guard 'grad_helth', ignored; did "
        "you mean 'grad_health'?"
    )
    lines = result.stderr.splitlines()
    assert lines[0].startswith(warning)
    assert lines[lines.index(PROGRAM_LINE) + 1].startswith(f"  {warning}")
    disabled = run_file(
        guard_python, script, tmp_path, AUTOGRAD_GUARD="1", AUTOGRAD_GUARD_DISABLE="grad_health"
    )
    assert "weights finite: False" in disabled.stdout and disabled.stderr == ""


@pytest.mark.parametrize("where", ["policy", "variable"])
def test_a_near_miss_of_stderr_keeps_the_events_on_stderr(guard_python, tmp_path, where):
    script = tmp_path / "nan_gradient.py"
    script.write_text(NAN)
    env = {"AUTOGRAD_GUARD": "1"}
    if where == "policy":
        (tmp_path / "autograd_guard.toml").write_text('log = "stdrr"\n')
    else:
        env["AUTOGRAD_GUARD_LOG"] = "stdrr"
    result = run_file(guard_python, script, tmp_path, **env)
    assert "did you mean 'stderr'?" in result.stderr.splitlines()[1]
    assert "[grad_health/nonfinite_gradient]" in result.stderr
    assert not (tmp_path / "stdrr").exists()


def test_strict_with_an_unreadable_policy_stops_at_the_import_of_torch(guard_python, tmp_path):
    (tmp_path / "autograd_guard.toml").write_text('mode = "strict"\nx = [\n')
    script = tmp_path / "nan_gradient.py"
    script.write_text("print('before', flush=True)\n" + NAN)
    result = run_file(guard_python, script, tmp_path, AUTOGRAD_GUARD="1")
    assert (result.returncode, result.stdout) == (2, "before\n")
    headline, problem = result.stderr.splitlines()
    assert "stopped at the import of torch, exit status 2" in headline
    assert "invalid TOML" in problem
    quiet = run_python(guard_python, "print('no torch here')", tmp_path, AUTOGRAD_GUARD="1")
    assert (quiet.stdout, quiet.stderr) == ("no torch here\n", "")


@pytest.fixture
def examples(tmp_path):
    """A copy of the repository's examples/ folder, run from its parent (the root)."""
    shutil.copytree(
        ROOT / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__")
    )
    return tmp_path / "examples"


def test_the_readme_main_job_works_from_the_repository_root(guard_python, examples, tmp_path):
    script = examples / "unique3d_app.py"
    unguarded = run_file(guard_python, script, tmp_path)
    assert unguarded.returncode == 1 and "does not require grad" in unguarded.stderr
    log = tmp_path / "events.jsonl"
    guarded = run_file(
        guard_python, script, tmp_path, AUTOGRAD_GUARD="1", AUTOGRAD_GUARD_LOG=str(log)
    )
    assert guarded.returncode == 0 and "stage 1 done" in guarded.stdout, guarded.stderr
    first = json.loads(log.read_text().splitlines()[0])
    assert first["action"] == "enable_grad"
    assert first["policy"] == (
        f"{examples / 'autograd_guard.toml'}, found from the program's folder {examples} up"
    )
    second = [json.loads(line) for line in log.read_text().splitlines()[1:]]
    assert all("policy" not in record for record in second)  # the first event only


def test_a_module_run_with_dash_m_finds_the_policy_of_its_package(guard_python, tmp_path):
    package = tmp_path / "src" / "app"
    package.mkdir(parents=True)
    (package / "__init__.py").touch()
    (package / "autograd_guard.toml").write_text('mode = "observe"\n')
    (package / "train.py").write_text(NAN)
    (tmp_path / "autograd_guard.toml").write_text('mode = "fix"\n')  # the working directory's
    result = subprocess.run(
        [str(guard_python), "-m", "app.train"],
        cwd=tmp_path,
        env=wheelenv.clean_environ(AUTOGRAD_GUARD="1", PYTHONPATH=str(tmp_path / "src")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "weights finite: False" in result.stdout  # observe: the steps run as unguarded
    assert f"policy: {package / 'autograd_guard.toml'}, found from the program's folder" in (
        result.stderr
    )


def run_in_a_terminal(python, script, cwd, **env):
    """``python script`` with its stdout and stderr on a pseudo-terminal: what it wrote."""
    leader, follower = pty.openpty()
    child = subprocess.Popen(
        [str(python), str(script)],
        cwd=cwd,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=wheelenv.clean_environ(XDG_CACHE_HOME=str(cwd / ".xdg-cache"), **env),
    )
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    assert child.wait(timeout=300) == 0
    return output.decode().replace("\r\n", "\n")


TRAIN = """
import torch
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(7):
    optimizer.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
print("trained")
"""


def test_a_terminal_gets_one_last_line_even_when_nothing_happened(guard_python, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    assert run_in_a_terminal(guard_python, script, tmp_path) == "trained\n"
    for _ in ("the whole install at start, which makes a start plan", "the plan's start"):
        guarded = run_in_a_terminal(guard_python, script, tmp_path, AUTOGRAD_GUARD="1")
        assert guarded == (
            "trained\nautograd-guard: on (mode fix, policy preset default); 7 optimizer steps "
            "watched; nothing to report\n"
        )
    piped = run_file(guard_python, script, tmp_path, AUTOGRAD_GUARD="1")
    assert (piped.stdout, piped.stderr) == ("trained\n", "")  # no terminal: silent
    nan = tmp_path / "nan_gradient.py"
    nan.write_text(NAN)
    reported = run_in_a_terminal(guard_python, nan, tmp_path, AUTOGRAD_GUARD="1")
    assert reported.splitlines()[-1].startswith("autograd-guard info: [autograd_guard/summary]")
    assert "nothing to report" not in reported


def test_run_refuses_python_dash_capital_s_plainly(guard_python, tmp_path):
    command = [str(guard_python), "-m", "autograd_guard.cli", "run", "--"]
    result = subprocess.run(
        [*command, str(guard_python), "-S", "-c", "print('ran')"],
        cwd=tmp_path,
        env=wheelenv.clean_environ(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"autograd-guard run: cannot guard {guard_python} -S...: ")
    assert "-S skips Python's site module" in result.stderr
