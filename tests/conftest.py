from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import thirdparty
import wheelenv
from helpers import ROOT, STAGE_SOURCE

from autograd_guard._common import STATE
from autograd_guard._engine import engine as _engine

# Tests of PyTorch3D skipped where its compiled extension must run them (see below).
SKIPPED_PYTORCH3D: list[str] = []

# The default run (`python -m pytest`, pyproject's addopts) leaves out the tests marked here,
# by file or by ``file::test_function``: `slow` ones take minutes (child interpreters by
# the hundred, two-rank torchrun jobs) and `download` ones install a library of their own
# into .cache/thirdparty first. `python -m pytest -m "slow or download"` runs them (CI's
# second step); a test file named on the command line runs whole.
DEFAULT_SELECTION = "not slow and not download"
MARKED: dict[str, str] = {
    "tests/test_warp.py": "download",  # Warp 1.5.1 and 1.19.0 (1.5 GB with the tape's two)
    "tests/test_warp_tape.py": "download",  # the same Warp releases
    "tests/test_warp_tape_copy.py": "download",  # Warp 1.16.0 and 1.17.0 as well
    "tests/test_grad_audit_warp.py": "download",  # Warp 1.16.0, 1.17.0 and 1.19.0
    "tests/test_grad_audit_roma.py": "download",  # RoMa 1.3.0 and 1.6.0
    "tests/test_grad_audit_pot.py": "download",  # POT 0.9.3, 0.9.4 and 0.9.7.post1
    "tests/test_grad_health_frameworks.py": "download",  # accelerate, Lightning, ...: 34 MB
    "tests/test_grad_health_distributed.py": "slow",  # 28 two-rank torchrun jobs
    "tests/twins/test_twins.py": "slow",  # every case twice or more in a fresh venv; Warp
    "tests/test_compile_autoload.py": "slow",  # inductor compiles C++ in child interpreters
}
# The peer libraries' own cases (pytorch_optimizer, Lightning), 34 MB with the frameworks
MARKED.update(
    {
        f"tests/test_grad_health_usage.py::{name}": "download"
        for name in (
            "test_pytorch_optimizer_swats_with_gradients_by_hand_passes_under_strict",
            "test_lightning_eval_mode_warning_with_a_layer_never_called_passes_under_strict",
            "test_lightnings_eval_mode_test_ends_with_status_0_under_strict",
        )
    }
)


def pytest_configure(config: pytest.Config) -> None:
    """The matrix (noxfile.py) tests the installed wheel, never the checkout's package.

    The real libraries the guards protect (PyTorch3D's Python code, gsplat) are installed
    once into .cache/thirdparty, each in a folder of its own, and put on sys.path before
    the test modules that import them are collected."""
    if config.option.markexpr == DEFAULT_SELECTION and _names_files(config):
        config.option.markexpr = ""  # a test file named on the command line runs whole
    if os.environ.get("AUTOGRAD_GUARD_TEST_INSTALLED") == "1":
        package = Path(_engine.__file__).resolve().parent.parent
        if package == ROOT / "autograd_guard":
            raise pytest.UsageError(f"testing the checkout's package, not the wheel: {package}")
    thirdparty.import_pytorch3d()
    gsplat = str(thirdparty.install("gsplat"))
    if gsplat not in sys.path:
        sys.path.insert(0, gsplat)


def _names_files(config: pytest.Config) -> bool:
    """The command line names test files (or tests in them), not folders or nothing."""
    here = config.invocation_params.dir
    return bool(config.args) and all((here / arg.split("::")[0]).is_file() for arg in config.args)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(item.path).resolve().relative_to(ROOT).as_posix()
        name = getattr(item, "originalname", item.name)
        marker = MARKED.get(f"{path}::{name}") or MARKED.get(path)
        if marker is not None:
            item.add_marker(marker)


def _compiled_pytorch3d_session() -> bool:
    return os.environ.get(thirdparty.PYTORCH3D_ENV) == "installed"


def _note_pytorch3d_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    """In the session of PyTorch3D's compiled wheel (``AUTOGRAD_GUARD_TEST_PYTORCH3D=installed``)
    a skipped test of a ``tests/test_pytorch3d*.py`` file is a failure: that session exists
    to run them against the real ``pytorch3d._C`` (elsewhere they skip without it)."""
    test_file = Path(report.nodeid.split("::")[0]).name
    if report.skipped and test_file.startswith("test_pytorch3d") and _compiled_pytorch3d_session():
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        SKIPPED_PYTORCH3D.append(f"{report.nodeid}: {reason}")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_pytorch3d_skip(report)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_pytorch3d_skip(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if SKIPPED_PYTORCH3D and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if SKIPPED_PYTORCH3D:
        terminalreporter.section("PyTorch3D tests skipped with its compiled extension", red=True)
        for line in SKIPPED_PYTORCH3D:
            terminalreporter.line(f"SKIPPED, counted as a failure: {line}", red=True)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """No ambient guard settings, no policy file from the checkout, nothing left installed,
    registered or cached."""
    for name in wheelenv.ENV_VARS[:-1]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.chdir(tmp_path)
    # Dynamo's count of compiled frames is per process: a test that compiled must not make
    # a later one look like a program that uses torch.compile (grad_health's loss check)
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    if dynamo_utils is not None:
        dynamo_utils.counters["frames"].clear()
    yield
    _engine.uninstall()
    STATE.reset()


@pytest.fixture
def fresh_dynamo():
    """torch.compile's caches emptied before and after the test."""
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def make_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write a module (dotted name) under tmp_path and make it importable; unload it after."""
    root = tmp_path / "modules"
    created: list[str] = []

    def make(name: str, source: str) -> str:
        parts = name.split(".")
        folder = root
        for package in parts[:-1]:
            folder = folder / package
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "__init__.py").touch()
        root.mkdir(exist_ok=True)
        (folder / f"{parts[-1]}.py").write_text(textwrap.dedent(source))
        created.append(name)
        return name

    monkeypatch.syspath_prepend(str(root))
    yield make
    for name in list(sys.modules):
        if any(
            name == c or name == c.split(".")[0] or name.startswith(c.split(".")[0] + ".")
            for c in created
        ):
            del sys.modules[name]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheelenv.build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def guard_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a fresh venv with the built wheel installed, outside the source tree."""
    return wheelenv.make_env(tmp_path_factory.mktemp("venv") / "env", wheel)


@pytest.fixture
def project(tmp_path):
    """A working directory holding a Unique3D-like stage module and, as examples/ does, a
    policy naming its stages (the shipped ``unique3d`` preset)."""
    package = tmp_path / "mesh_reconstruction"
    package.mkdir()
    (package / "__init__.py").touch()
    (package / "recon.py").write_text(STAGE_SOURCE)
    (tmp_path / "autograd_guard.toml").write_text('extends = "unique3d"\n')
    return tmp_path


os.environ.setdefault("PYTHONHASHSEED", "0")
