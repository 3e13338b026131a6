"""What several test modules share: the checkout's root, a Unique3D-like stage, a child
interpreter runner, and the check that a guard is attached before a test asserts silence."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path
from typing import Any

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


def guard_state(guard: str, status: dict[str, Any] | None = None) -> str:
    """Where ``guard`` stands, in words ("patched", "hooked into torch.optim.optimizer",
    "not needed for warp-lang 1.19.0", ...), from ``status``: a child interpreter's
    ``autograd_guard.status()``; this process's by default."""
    if status is None:
        import autograd_guard

        status = autograd_guard.status()
    assert status["installed"], f"autograd-guard is not installed: {status}"
    row = status["guards"].get(guard)
    assert row is not None, f"no guard {guard!r}: {sorted(status['guards'])}"
    return " ".join(part for part in (row["state"], row.get("detail")) if part)


def assert_attached(guard: str, *places: str, status: dict[str, Any] | None = None) -> None:
    """``guard`` is attached: it patched its targets, ``places`` among them (``module:qualname``
    as ``status()`` lists them), or, for a guard that wraps nothing (grad_health), it hooked
    into the module ``places`` names. A test that asserts no event calls this first, so that
    it cannot pass because nothing was guarded. ``status`` as for ``guard_state``."""
    if status is None:
        import autograd_guard

        status = autograd_guard.status()
    state = guard_state(guard, status)
    if state.startswith("hooked into "):  # wraps nothing: hooked into a module
        attached = [state.removeprefix("hooked into ")]
    else:
        assert state == "patched", f"{guard} is not attached: {state}"
        attached = status["guards"][guard]["patched"]
    assert attached, f"{guard} is patched nowhere"
    missing = [place for place in places if place not in attached]
    assert not missing, f"{guard} is not attached at {missing}, only at {attached}"


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
