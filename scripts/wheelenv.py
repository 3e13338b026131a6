"""Build the wheel and make throw-away environments that install it like a user would.

Shared by the tests and the benchmarks. An editable install never exercises the
``.pth`` file, so these environments get the real wheel. Dependencies (torch, wrapt,
structlog, packaging) come from this interpreter's site-packages through a plain path
entry, which adds them to ``sys.path`` without processing that folder's ``.pth`` files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV_VARS = (
    "AUTOGRAD_GUARD",
    "AUTOGRAD_GUARD_POLICY",
    "AUTOGRAD_GUARD_DISABLE",
    "AUTOGRAD_GUARD_LOG",
    "AUTOGRAD_GUARD_CACHE",
    "PYTHONPATH",
)


def build_wheel(out: Path) -> Path:
    """Build the project's wheel into ``out`` (hatchling must be importable)."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
    )
    return next(out.glob("autograd_guard-*.whl"))


def make_env(root: Path, wheel: Path | None, host_packages: bool = True) -> Path:
    """A venv at ``root``, with ``wheel`` installed in it; returns its python."""
    if root.exists():
        shutil.rmtree(root)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site_packages = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    if host_packages:
        paths = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
        (site_packages / "zz_host_packages.pth").write_text("\n".join(paths) + "\n")
    if wheel is not None:
        pip_install_target(site_packages, str(wheel), "--no-index")
    return python


def pip_install_target(folder: Path, *arguments: str, env: dict[str, str] | None = None) -> None:
    """``pip install --no-deps --target folder ...`` with this interpreter's pip."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(folder),
            *arguments,
        ],
        check=True,
        env=env,
    )


def clean_environ(**overrides: str) -> dict[str, str]:
    """This process's environment without any autograd-guard setting, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(overrides)
    return env
