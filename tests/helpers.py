"""What several test modules share: the checkout's root, a Unique3D-like stage, and a
child interpreter runner."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import wheelenv

ROOT = Path(__file__).resolve().parent.parent


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


def ipex_standin(site: Path, version: str) -> Path:
    """Stand-in for intel-extension-for-pytorch (no +xpu wheel installs here): real
    dist-info metadata of ``version`` and an empty module, in the folder ``site``."""
    package = site / "intel_extension_for_pytorch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f'__version__ = "{version}"\n')
    info = site / f"intel_extension_for_pytorch-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: intel-extension-for-pytorch\nVersion: {version}\n"
    )
    return site
