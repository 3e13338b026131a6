from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import wheelenv  # noqa: E402

from autograd_guard import _engine  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """No ambient guard settings, no policy file from the checkout, nothing left installed."""
    for name in wheelenv.ENV_VARS[:-1]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.chdir(tmp_path)
    yield
    _engine.uninstall()


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
    """A working directory holding a Unique3D-like stage module."""
    package = tmp_path / "mesh_reconstruction"
    package.mkdir()
    (package / "__init__.py").touch()
    (package / "recon.py").write_text(STAGE_SOURCE)
    return tmp_path


def run_python(
    python: Path | str, code: str, cwd: Path, *args: str, check: bool = True, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a child interpreter with a clean environment plus ``env``."""
    environ = wheelenv.clean_environ(**env)
    environ.setdefault("XDG_CACHE_HOME", str(cwd / ".xdg-cache"))
    result = subprocess.run(
        [str(python), *args, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"child failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


STAGE_SOURCE = """
import torch

def reconstruct_stage1(target, steps=25):
    # A small real optimisation loop, like Unique3D's stage 1 fitting.
    verts = torch.zeros_like(target, requires_grad=True)
    optimizer = torch.optim.Adam([verts], lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = ((verts - target) ** 2).mean()
        loss.backward()
        optimizer.step()
    return verts.detach(), loss.item()
"""

os.environ.setdefault("PYTHONHASHSEED", "0")
