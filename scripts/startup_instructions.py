"""Start-up cost of autograd-guard in instructions (callgrind), where valgrind is present.

Wall time on a shared machine is noisy; an instruction count is not. Compares ``python -c
pass`` in a bare venv with a bare venv holding the built wheel (non-editable) and its
dependencies (wrapt, structlog, packaging; tomli before 3.11) copied from this interpreter,
with ``AUTOGRAD_GUARD`` unset and set (warm cache).

    python scripts/startup_instructions.py
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import wheelenv
from benchtable import Row, print_table

DEPENDENCIES = (
    "wrapt",
    "structlog",
    "packaging",
    *(("tomli",) if sys.version_info < (3, 11) else ()),
)


def available() -> bool:
    return shutil.which("valgrind") is not None


def copy_distribution(name: str, site_packages: Path) -> None:
    """Copy one installed distribution's files (its dist-info included) into ``site_packages``."""
    dist = metadata.distribution(name)
    for file in dist.files or ():
        source = Path(str(dist.locate_file(file)))
        if file.parts[0] == ".." or not source.is_file() or "__pycache__" in file.parts:
            continue
        target = site_packages / file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def site_packages_of(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.check_output([str(python), "-c", code], text=True).strip())


def instructions(cmd: list[str], env: dict[str, str], cwd: str) -> int:
    """The instructions callgrind counts for one run of ``cmd``."""
    result = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd],
        env=env,
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    )
    found = re.search(r"Collected\s*:\s*(\d+)", result.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in callgrind's output:\n{result.stderr}")
    return int(found.group(1))


def measure() -> list[Row]:
    work = Path(tempfile.mkdtemp(prefix="ag-callgrind-"))
    try:
        wheel = wheelenv.build_wheel(work / "wheel")
        bare = wheelenv.make_env(work / "bare", None, host_packages=False)
        installed = wheelenv.make_env(work / "installed", wheel, host_packages=False)
        for name in DEPENDENCIES:
            copy_distribution(name, site_packages_of(installed))
        off = wheelenv.clean_environ(XDG_CACHE_HOME=str(work / "cache"))
        on = {**off, "AUTOGRAD_GUARD": "1"}
        cwd = str(work)
        for python in (bare, installed):  # compile the bytecode; warm the guard's cache
            for env in (off, on):
                subprocess.run([str(python), "-c", "pass"], env=env, cwd=cwd, check=True)
        base = instructions([str(bare), "-c", "pass"], off, cwd)
        unset = instructions([str(installed), "-c", "pass"], off, cwd)
        on_count = instructions([str(installed), "-c", "pass"], on, cwd)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mega = 1e6
    return [
        Row(
            "callgrind",
            "installed, variable unset vs bare venv",
            base / mega,
            unset / mega,
            "M",
            "<= +2%",
        ),
        Row(
            "callgrind",
            "variable set, warm cache vs bare venv",
            base / mega,
            on_count / mega,
            "M",
            "<= +10%",
        ),
    ]


def main() -> None:
    if not available():
        print("valgrind is not installed: no instruction counts")
        return
    print_table(measure(), f"start-up in instructions (callgrind), Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
