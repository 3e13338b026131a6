"""The auto-load, exercised as users get it: the built wheel installed in a fresh venv
outside the source tree, and child interpreters with and without the variable."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import wheelenv
from helpers import ROOT, run_python

LOADED = """
import sys
print(sorted({m.split('.')[0] for m in sys.modules} & {'autograd_guard', 'wrapt', 'structlog',
      'torch', 'tomllib', 'importlib_metadata', 'packaging'}))
"""

CALL_STAGE = """
import torch
from mesh_reconstruction.recon import reconstruct_stage1
torch.set_grad_enabled(False)
try:
    print("loss", reconstruct_stage1(torch.ones(3))[1])
except RuntimeError as exc:
    print("failed:", exc)
"""


@pytest.mark.parametrize("value", [None, "", "0", "off", "OFF"])
def test_unset_imports_nothing(guard_python, project, value):
    env = {} if value is None else {"AUTOGRAD_GUARD": value}
    out = run_python(guard_python, LOADED, project, **env).stdout
    assert out.strip() == "[]"


def test_set_without_target_imports_only_the_bootstrap(guard_python, project):
    run_python(guard_python, "pass", project, AUTOGRAD_GUARD="1")  # warms the caches
    out = run_python(guard_python, LOADED, project, AUTOGRAD_GUARD="1").stdout
    assert out.strip() == "['autograd_guard']"
    # Nothing else either: each stdlib module (threading, re, pathlib...) costs start-up time.
    modules = "import sys; print(sorted(sys.modules))"
    unset = set(eval(run_python(guard_python, modules, project).stdout))
    guarded = set(eval(run_python(guard_python, modules, project, AUTOGRAD_GUARD="1").stdout))
    assert {m for m in guarded - unset if not m.startswith("autograd_guard")} == set()
    # Three modules of the package (each costs start-up time): the plan holds, so the
    # engine, the policy and even the post-import hooks wait for a watched module.
    assert sorted(guarded - unset) == [
        "autograd_guard",
        "autograd_guard._boot",
        "autograd_guard._common",
    ]


def test_stage_is_guarded_when_set(guard_python, project):
    unguarded = run_python(guard_python, CALL_STAGE, project)
    assert "failed: element 0 of tensors does not require grad" in unguarded.stdout
    guarded = run_python(guard_python, CALL_STAGE, project, AUTOGRAD_GUARD="1")
    assert guarded.stdout.startswith("loss ")
    assert "[grad_mode/enable_grad] stage entered with grad disabled" in guarded.stderr
    assert "<string>:6" in guarded.stderr  # the line of the call in CALL_STAGE
    assert "summary: 1 intervention at 1 call site" in guarded.stderr


def test_target_imported_before_the_guard_starts(guard_python, project):
    # sitecustomize runs before the deferred start, so its import comes first.
    (project / "sitecustomize.py").write_text(
        "from mesh_reconstruction.recon import reconstruct_stage1\n"
    )
    code = """
    import sitecustomize, torch
    torch.set_grad_enabled(False)
    print("loss", sitecustomize.reconstruct_stage1(torch.ones(3))[1])
    """
    result = run_python(guard_python, code, project, AUTOGRAD_GUARD="1", PYTHONPATH=str(project))
    assert result.stdout.startswith("loss ")
    assert (
        "sitecustomize:reconstruct_stage1" in result.stderr
    )  # the late patch fixed the stale name


def test_children_are_guarded(guard_python, project):
    code = """
    import multiprocessing as mp, subprocess, sys

    def child(queue):
        import torch
        from mesh_reconstruction.recon import reconstruct_stage1
        torch.set_grad_enabled(False)
        queue.put(reconstruct_stage1(torch.ones(3))[1])

    if __name__ == "__main__":
        for method in ("spawn", "fork"):
            context = mp.get_context(method)
            queue = context.Queue()
            process = context.Process(target=child, args=(queue,))
            process.start()
            print(method, queue.get(timeout=120) < 1.0)
            process.join()
        stage = "import torch; from mesh_reconstruction.recon import reconstruct_stage1 as s; " \\
                "torch.set_grad_enabled(False); print('subprocess', s(torch.ones(3))[1] < 1.0)"
        print(subprocess.run([sys.executable, "-c", stage], capture_output=True,
                             text=True).stdout.strip())
    """
    (project / "main.py").write_text(textwrap.dedent(code))
    result = subprocess.run(
        [str(guard_python), "main.py"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        env=wheelenv.clean_environ(AUTOGRAD_GUARD="1", PYTHONPATH=str(project)),
    )
    assert result.stdout.split("\n")[:3] == ["spawn True", "fork True", "subprocess True"], (
        result.stdout + result.stderr
    )


def test_invalid_policy_is_partly_used_with_a_clear_warning(guard_python, project):
    (project / "autograd_guard.toml").write_text('extends = "unique3d"\nmode = "loud"\n')
    result = run_python(guard_python, CALL_STAGE, project, AUTOGRAD_GUARD="1")
    assert "loss" in result.stdout  # guarded: the stage's rule still applies
    assert "invalid policy: 1 setting ignored, the rest applies" in result.stderr
    assert f"{project / 'autograd_guard.toml'}: mode: invalid value 'loud'" in result.stderr
    assert "allowed: 'off', 'observe', 'fix', 'strict'" in result.stderr


def test_invalid_policy_in_strict_stops_only_at_the_import_of_torch(guard_python, project):
    """The stop is clean (SystemExit in a .pth line would be "Fatal Python error:
    init_import_site" with a traceback), at the program's import of torch: a program that
    never imports torch (pip, the autograd-guard command, whose check is how the policy
    gets fixed) runs on."""
    policy = project / "autograd_guard.toml"
    policy.write_text('mode = "strict"\nspeed = 3\n')
    code = "print('ran', flush=True)\nimport torch\nprint('not reached')"
    plain = run_python(guard_python, code, project, check=False, AUTOGRAD_GUARD="1")
    assert (plain.returncode, plain.stdout) == (2, "ran\n")
    assert plain.stderr.splitlines() == [
        f"autograd-guard: invalid policy in strict mode (mode = 'strict' in {policy}): stopped "
        "at the import of torch, exit status 2 (1 problem to fix; or unset AUTOGRAD_GUARD):",
        f"  {policy}: speed: unknown key (allowed: extends, mode, log, disable, guards, rules)",
    ]
    pip = _run_module(guard_python, project, "pip", "--version")
    assert (pip.returncode, pip.stdout[:4], pip.stderr) == (0, "pip ", "")
    check = _run_module(guard_python, project, "autograd_guard.cli", "check")
    assert check.returncode == 1 and check.stderr.splitlines() == [
        f"invalid policy: {policy}: speed: unknown key (allowed: extends, mode, log, disable, "
        "guards, rules)"
    ]


def _run_module(python, cwd, *args):
    """``python -m ARGS`` with the variable set."""
    return subprocess.run(
        [str(python), "-m", *args],
        env=wheelenv.clean_environ(AUTOGRAD_GUARD="1"),
        cwd=cwd,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    ("policy", "env", "asked"),
    [
        (
            None,
            {"AUTOGRAD_GUARD": "stirct"},
            "AUTOGRAD_GUARD value in strict mode (AUTOGRAD_GUARD=stirct",
        ),
        (
            'mode = "strcit"\n',
            {"AUTOGRAD_GUARD": "1"},
            "policy in strict mode (mode = 'strcit' in ",
        ),
        (
            None,
            {"AUTOGRAD_GUARD": "1", "AUTOGRAD_GUARD_POLICY": "strcit"},
            "_POLICY value in strict mode (AUTOGRAD_GUARD_POLICY=strcit",
        ),
        (
            "mode = 'strict'\nx = [" * 3000 + "\n",
            {"AUTOGRAD_GUARD": "on"},
            "policy in strict mode (mode = 'strict' on line 1 of",
        ),
    ],
)
def test_a_near_miss_of_strict_stops_too(guard_python, project, policy, env, asked):
    """The message's own did-you-mean said strict: the run must not go on unguarded. The
    headline names what is invalid: a variable (AUTOGRAD_GUARD=stirct) is no policy."""
    if policy is not None:
        (project / "autograd_guard.toml").write_text(policy)
    result = run_python(guard_python, CALL_STAGE, project, check=False, **env)
    assert (result.returncode, result.stdout) == (2, "")
    headline, *problems = result.stderr.splitlines()
    assert headline.startswith("autograd-guard: invalid ") and asked in headline
    assert problems and all(line.startswith("  ") for line in problems)
    assert "Traceback" not in result.stderr and "Fatal" not in result.stderr


def test_invalid_policy_not_in_strict_says_it_at_start_and_at_exit(guard_python, project):
    (project / "autograd_guard.toml").write_text('extends = "unique3d"\nspeed = 3\n')
    result = run_python(guard_python, CALL_STAGE, project, AUTOGRAD_GUARD="1")
    assert "loss" in result.stdout
    path = project / "autograd_guard.toml"
    said = [
        "autograd-guard: invalid policy: 1 setting ignored, the rest applies and the guard is "
        "on ('autograd-guard check' lists them):",
        f"autograd-guard: {path}: speed: unknown key (allowed: extends, mode, log, disable, "
        "guards, rules)",
    ]
    lines = result.stderr.splitlines()
    assert lines[:2] == said
    assert lines[lines.index("autograd-guard: said at start:") + 1 :][:2] == [
        f"  {line}" for line in said
    ]


def test_uninstall_restores_the_original(guard_python, project):
    code = """
    import autograd_guard, mesh_reconstruction.recon as recon
    original = recon.reconstruct_stage1.__wrapped__
    autograd_guard.uninstall()
    print(recon.reconstruct_stage1 is original, autograd_guard.status()["installed"])
    """
    assert run_python(guard_python, code, project, AUTOGRAD_GUARD="1").stdout.strip() == (
        "True False"
    )


def test_runs_once_when_the_pth_is_processed_twice(guard_python, project):
    code = """
    import site, sys, sysconfig
    site.addsitedir(sysconfig.get_paths()["purelib"])  # processes autograd_guard.pth again
    from autograd_guard._common import importer as _importer
    print(sum(isinstance(f, _importer._PostImportFinder) for f in sys.meta_path))
    """
    assert run_python(guard_python, code, project, AUTOGRAD_GUARD="1").stdout.strip() == "1"


def test_python_dash_s_skips_the_pth(guard_python, project):
    out = run_python(guard_python, LOADED, project, "-S", AUTOGRAD_GUARD="1").stdout
    assert "autograd_guard" not in out


def test_run_command_where_pth_files_are_not_processed(wheel, tmp_path, project):
    # A --target install on PYTHONPATH: its .pth is never processed, `run` starts the guard.
    target = tmp_path / "target"
    wheelenv.pip_install_target(target, str(wheel))
    (project / "usercode.py").write_text(textwrap.dedent(CALL_STAGE))
    env = wheelenv.clean_environ(PYTHONPATH=f"{target}:{project}")
    plain = subprocess.run(
        [sys.executable, "usercode.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "failed: element 0" in plain.stdout
    guarded = subprocess.run(
        [sys.executable, "-m", "autograd_guard.cli", "run", "--", sys.executable, "usercode.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert guarded.stdout.startswith("loss "), guarded.stderr
    assert "grad_mode/enable_grad" in guarded.stderr


def test_editable_install_auto_loads(tmp_path, project):
    python = wheelenv.make_env(tmp_path / "editable", None)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-e",
            str(ROOT),
        ],
        check=True,
    )
    result = run_python(python, CALL_STAGE, project, AUTOGRAD_GUARD="1")
    assert result.stdout.startswith("loss ")


LAZY = """
import sys
print("engine" if "autograd_guard._engine.engine" in sys.modules else "no engine")
import torch
from mesh_reconstruction.recon import reconstruct_stage1
print("engine" if "autograd_guard._engine.engine" in sys.modules else "no engine")
torch.set_grad_enabled(False)
print("loss", round(reconstruct_stage1(torch.ones(3))[1], 3))
"""


def test_a_start_plan_defers_the_engine_to_the_first_target_import(guard_python, project):
    first = run_python(guard_python, LAZY, project, AUTOGRAD_GUARD="1")  # makes the plan
    assert first.stdout.splitlines()[0] == "engine"
    lazy = run_python(guard_python, LAZY, project, AUTOGRAD_GUARD="1").stdout.splitlines()
    assert lazy[:2] == ["no engine", "engine"] and lazy[2].startswith("loss ")
    modules = "import sys; print(sorted(m for m in sys.modules if m.startswith('autograd_guard')))"
    loaded = eval(run_python(guard_python, modules, project, AUTOGRAD_GUARD="1").stdout)
    assert "autograd_guard.guards" not in loaded and "autograd_guard._runtime.wrapper" not in loaded


def test_a_start_plan_follows_edits_of_the_policy(guard_python, project):
    (project / "other_stage.py").write_text(
        "import torch\n\ndef fit():\n    return torch.is_grad_enabled()\n"
    )
    policy = project / "autograd_guard.toml"
    policy.write_text('extends = "default"\n')
    code = (
        "import torch\ntorch.set_grad_enabled(False)\nimport other_stage\nprint(other_stage.fit())"
    )
    assert run_python(guard_python, code, project, AUTOGRAD_GUARD="1").stdout == "False\n"
    policy.write_text(
        'extends = "default"\n[[rules]]\ntarget = "other_stage:fit"\naction = "enable_grad"\n'
    )
    assert run_python(guard_python, code, project, AUTOGRAD_GUARD="1").stdout == "True\n"


def test_a_start_plan_of_the_wrong_shape_is_ignored(guard_python, project):
    import marshal

    run_python(guard_python, "pass", project, AUTOGRAD_GUARD="1")
    import os
    from pathlib import Path

    folder = Path(os.environ["XDG_CACHE_HOME"]) / "autograd-guard"
    [cache] = folder.glob("plans-*.marshal")
    data = marshal.loads(cache.read_bytes())
    data["entries"] = {key: {"files": "x", "modules": 3} for key in data["entries"]}
    cache.write_bytes(marshal.dumps(data))
    assert run_python(guard_python, CALL_STAGE, project, AUTOGRAD_GUARD="1").stdout.startswith(
        "loss "
    )


def test_pytest_with_warnings_as_errors_runs_with_the_guard_on(guard_python, project):
    # The .pth imports the package before pytest loads its plugin from the same distribution.
    (project / "test_user.py").write_text("def test_it():\n    assert 1 + 1 == 2\n")
    for env in ({}, {"AUTOGRAD_GUARD": "1"}):
        result = run_python(
            guard_python,
            "import sys, pytest; sys.exit(pytest.main(['-W', 'error', '-q', 'test_user.py']))",
            project,
            check=False,
            **env,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "1 passed" in result.stdout


def test_a_start_plan_follows_a_policy_replaced_with_the_same_size_and_mtime(guard_python, project):
    # Issue 19 item 5: `cp -p`, `tar x` and images with fixed timestamps keep size and mtime.
    # A stale plan watches stage_a only: stage_b, imported before torch (whose import starts
    # the engine), would be left unpatched, without an event.
    for name in ("stage_a", "stage_b"):
        (project / f"{name}.py").write_text(
            "import torch\n\ndef fit():\n    return torch.is_grad_enabled()\n"
        )
    policy = project / "autograd_guard.toml"
    rule = '[[rules]]\ntarget = "stage_b:fit"\naction = "enable_grad"\n'
    policy.write_text(rule.replace("stage_b", "stage_a"))  # the same size
    stamp = policy.stat()
    code = "import stage_b\nimport torch\ntorch.set_grad_enabled(False)\nprint(stage_b.fit())"
    for _ in range(2):  # the second run starts from the plan the first one made
        assert run_python(guard_python, code, project, AUTOGRAD_GUARD="1").stdout == "False\n"
    policy.write_text(rule)
    os.utime(policy, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert policy.stat().st_size == stamp.st_size
    assert run_python(guard_python, code, project, AUTOGRAD_GUARD="1").stdout == "True\n"


def test_a_start_plan_follows_a_policy_that_discovery_now_finds_first(guard_python, project):
    # The plan was made under the project's policy; a pyproject.toml with a table, nearer
    # to the working directory, is now the one discovered: the plan must not hold.
    work = project / "work"
    work.mkdir()
    (work / "other_stage.py").write_text(
        "import torch\n\ndef fit():\n    return torch.is_grad_enabled()\n"
    )
    # other_stage is imported before torch: a stale plan, which does not watch it, would
    # start the engine inside its import (of torch), too late to patch it, without an event.
    code = (
        "import other_stage\nimport torch\ntorch.set_grad_enabled(False)\nprint(other_stage.fit())"
    )
    # There from the start (a new file would change the folder's mtime, which the plan
    # holds as a folder on sys.path): only its contents change.
    (work / "pyproject.toml").write_text("[project]\nname = 'work'\n")
    for _ in range(2):  # the second run starts from the plan the first one made
        assert run_python(guard_python, code, work, AUTOGRAD_GUARD="1").stdout == "False\n"
    (work / "pyproject.toml").write_text(
        '[tool.autograd_guard]\nextends = "default"\n'
        '[[tool.autograd_guard.rules]]\ntarget = "other_stage:fit"\naction = "enable_grad"\n'
    )
    assert run_python(guard_python, code, work, AUTOGRAD_GUARD="1").stdout == "True\n"


def test_before_a_planned_import_status_and_uninstall_see_the_plan(guard_python, project):
    run_python(guard_python, "pass", project, AUTOGRAD_GUARD="1")  # makes the plan
    code = (
        "import autograd_guard\n"
        "status = autograd_guard.status()\n"
        "print('torch.optim.optimizer' in status['watching'], status['installed'])\n"
        "autograd_guard.uninstall()\n"
        "import sys, torch.optim\n"  # a planned module: nothing may install now
        "print(autograd_guard.status()['installed'], autograd_guard.status()['watching'])\n"
        "print([f for f in sys.meta_path if type(f).__module__.startswith('autograd_guard')])\n"
    )
    out = run_python(guard_python, code, project, AUTOGRAD_GUARD="1").stdout
    assert out == "True False\nFalse []\n[]\n"
