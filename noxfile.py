"""The version matrix: every Python and torch our users run, one nox session per cell.

    nox                         # every cell, then the README's table (nox -s table)
    nox -s py3.10-torch2.1.2    # one cell
    nox -s py3.10-torch2.1.2 -- tests/test_compile.py   # one cell, some tests

Each cell builds the wheel, installs it (not editable) with the cell's torch into a venv
of its own under ``.nox/``, and runs the suite against the installed package from outside
the source tree's import path. Interpreters are the machine's ``python3.X``; where that is
a pyenv shim with no version selected, the pyenv version folder is used directly. torch
other than the pinned CPU wheel is a CUDA build from the index, run on the CPU; pip's own
cache keeps one download per machine. Results go to ``.nox/results/<cell>.xml``.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import nox

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / ".nox" / "results"
TABLE_START, TABLE_END = "<!-- matrix table: nox -s table -->", "<!-- end of matrix table -->"

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = []  # filled below: every cell, then the table

# cell name -> (Python, torch, pins that differ from constraints.txt)
CELLS: dict[str, tuple[str, str, dict[str, str]]] = {
    # torch < 2.3 is built against NumPy 1; 2.1's cpp_extension imports pkg_resources.packaging,
    # which setuptools 70 removed.
    "py3.10-torch2.1.2": ("3.10", "2.1.2", {"numpy": "1.26.4", "setuptools": "69.5.1"}),
    "py3.10-torch2.4.1": ("3.10", "2.4.1", {"numpy": "2.2.6"}),
    "py3.12-torch2.6.0": ("3.12", "2.6.0", {"numpy": "2.2.6"}),
    "py3.13-torch2.9.1": ("3.13", "2.9.1", {"numpy": "2.3.5"}),
    "py3.11-torch2.13.0": ("3.11", "2.13.0", {}),  # the pinned cell: constraints.txt as is
    "py3.13-torch2.15.0": ("3.13", "2.15.0", {}),  # the newest release the index serves
}
# Cells of a library's compiled code: cell name -> (Python, torch, pins, what to install,
# the tests to run, their environment). easypytorch3d 0.7.9.post1's cp311 wheel carries
# PyTorch3D's compiled pytorch3d._C, which loads with torch 2.11 and 2.12 only; its tests
# run against it, and a missing _C or a skipped test of theirs fails the cell (conftest.py).
LIBRARY_CELLS: dict[str, tuple[str, str, dict[str, str], list[str], list[str], dict[str, str]]] = {
    "py3.11-torch2.12.0-pytorch3d": (
        "3.11",
        "2.12.0",
        {"easypytorch3d": "0.7.9.post1"},
        ["easypytorch3d"],
        sorted(str(path.relative_to(ROOT)) for path in ROOT.glob("tests/test_pytorch3d*.py")),
        {"AUTOGRAD_GUARD_TEST_PYTORCH3D": "installed"},
    ),
}


def interpreter(version: str) -> str:
    """An absolute path to a working ``python{version}``."""
    found = shutil.which(f"python{version}")
    if found and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0:
        return found
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(f"{pyenv_root}/versions/{version}.*/bin/python{version}"))
    return candidates[-1] if candidates else f"python{version}"


def cell_constraints(session: nox.Session, torch: str, pins: dict[str, str]) -> Path:
    """constraints.txt with the cell's torch and pins, written into the session's venv."""
    pins = {"torch": torch, **pins}
    lines = []
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name = line.split("==")[0].strip()
        if name in pins:
            line = f"{name}=={pins.pop(name)}"
        lines.append(line)
    lines += [f"{name}=={version}" for name, version in pins.items()]
    path = Path(session.virtualenv.location) / "constraints.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_cell(
    session: nox.Session,
    name: str,
    torch: str,
    pins: dict[str, str],
    libraries: Sequence[str] = (),
    tests: Sequence[str] = (),
    test_env: Mapping[str, str] | None = None,
) -> None:
    constraints = cell_constraints(session, torch, pins)
    # Replaces any machine-wide pip constraint (a cap below the cell's torch) with the cell's.
    env = {"PIP_CONSTRAINT": str(constraints)}
    wheel = build_wheel(session, env)
    session.install(f"{wheel}[test]", *libraries, env=env)
    run_tests(session, name, tests, test_env)


def build_wheel(session: nox.Session, env: dict[str, str]) -> Path:
    """The project's wheel, built in the session's venv and installed (no dependencies)."""
    session.install("hatchling", "pip", env=env)
    dist = Path(session.create_tmp()) / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run_install(
        "python", "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
        "-w", str(dist), str(ROOT),
    )  # fmt: skip
    wheel = next(dist.glob("autograd_guard-*.whl"))
    session.install("--force-reinstall", "--no-deps", str(wheel), env=env)
    return wheel


def run_tests(
    session: nox.Session, name: str, tests: Sequence[str], test_env: Mapping[str, str] | None
) -> None:
    """pytest on the installed wheel; a cell's whole selection, the slow and downloading
    tests included (-m ""), goes into the matrix table, and one narrowed by arguments
    (`nox -s CELL -- tests/x.py`) is kept apart."""
    results = RESULTS / "partial" if session.posargs else RESULTS
    results.mkdir(parents=True, exist_ok=True)
    session.run(
        "pytest",
        f"--junitxml={results / name}.xml",
        "-o", f"junit_suite_name={name}",
        "-m", "",
        *(session.posargs or tests),
        env={"AUTOGRAD_GUARD_TEST_INSTALLED": "1", **(test_env or {})},
    )  # fmt: skip


def _define(name: str, python: str, *cell_args: Any) -> None:
    @nox.session(name=name, python=interpreter(python))
    def cell(session: nox.Session) -> None:
        run_cell(session, name, *cell_args)

    nox.options.sessions.append(name)


for _name, (_python, *_cell) in CELLS.items():
    _define(_name, _python, *_cell)
for _name, (_python, *_cell) in LIBRARY_CELLS.items():
    _define(_name, _python, *_cell)


# The lowest versions of its own dependencies that pyproject.toml allows, with the pinned
# torch, on the tests of the code that uses them: the events (structlog), the proxies and
# the patching (wrapt), the version ranges (packaging). pytest 9 needs packaging >= 22,
# hatchling (which builds the wheel) and wheel (which builds PyTorch3D's Python code) >= 24:
# the cell installs the test extra as pinned, fills the library cache, then installs the
# lower bounds over the newer versions, with pytest 8. Its tests build no wheel of their own.
LOWEST = {"wrapt": "1.14.0", "structlog": "22.1.0", "packaging": "21.0"}
LOWEST_TESTS = [
    f"tests/test_{name}.py"
    for name in (
        "events", "event_output", "engine", "guard_contract", "invisible", "fault_injection",
        "report", "silence", "grad_mode", "snapshot_inputs", "policy", "cli",
    )
]  # fmt: skip


@nox.session(name="py3.11-torch2.13.0-lowest", python=interpreter("3.11"))
def lowest(session: nox.Session) -> None:
    env = {"PIP_CONSTRAINT": str(cell_constraints(session, "2.13.0", {}))}
    wheel = build_wheel(session, env)
    session.install(f"{wheel}[test]", env=env)
    session.run("python", "scripts/thirdparty.py", "pytorch3d", "gsplat")  # the cache, as pinned
    lowered = cell_constraints(session, "2.13.0", {**LOWEST, "pytest": "8.4.2"})
    session.install(*LOWEST, "pytest", "pyparsing", env={"PIP_CONSTRAINT": str(lowered)})
    session.run("python", "-c", f"import importlib.metadata as m; print({_versions()})")
    run_tests(session, "py3.11-torch2.13.0-lowest", LOWEST_TESTS, None)


def _versions() -> str:
    return "{" + ", ".join(f"{name!r}: m.version({name!r})" for name in LOWEST) + "}"


nox.options.sessions.append("py3.11-torch2.13.0-lowest")


@nox.session(name="typing", python=interpreter("3.11"))
def typing_session(session: nox.Session) -> None:
    """mypy with the pinned wrapt, then with the newest one the index serves: wrapt ships its
    own types since 2.0, and they change with it."""
    env = {"PIP_CONSTRAINT": str(cell_constraints(session, "2.13.0", {}))}
    session.install("-e", ".[dev]", "torch", "pytest", env=env)  # the pytest plugin
    session.run("mypy", "autograd_guard")
    session.install("--upgrade", "wrapt", env={"PIP_CONSTRAINT": ""})
    session.run("python", "-c", "import wrapt; print('newest wrapt:', wrapt.__version__)")
    session.run("mypy", "autograd_guard")


@nox.session(python=False)
def table(session: nox.Session) -> None:
    """The matrix table from the cells' last results, printed and put in the README."""
    text = matrix_table()
    print(text)
    readme = ROOT / "README.md"
    before, start, rest = readme.read_text().partition(TABLE_START)
    _, end, after = rest.partition(TABLE_END)
    if start and end:
        readme.write_text(f"{before}{start}\n{text}\n{end}{after}")


nox.options.sessions.append("table")


def matrix_table() -> str:
    rows = ["| cell (Python + torch) | passed | failed | skipped | run |", "|---|---|---|---|---|"]
    cells = [(name, f"{python} + {torch}") for name, (python, torch, _) in CELLS.items()]
    cells += [
        (name, f"{python} + {torch} + {' '.join(f'{k} {v}' for k, v in pins.items())} (its tests)")
        for name, (python, torch, pins, *_) in LIBRARY_CELLS.items()
    ]
    lowered = ", ".join(f"{name} {version}" for name, version in LOWEST.items())
    cells.append(("py3.11-torch2.13.0-lowest", f"3.11 + 2.13.0 + {lowered} (their tests)"))
    for name, label in cells:
        path = RESULTS / f"{name}.xml"
        if not path.exists():
            rows.append(f"| {label} | not run | | | |")
            continue
        suite = ElementTree.parse(path).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        assert suite is not None
        total, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
        failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        passed = total - skipped - failed
        day = suite.get("timestamp", "")[:10]
        rows.append(f"| {label} | {passed} | {failed} | {skipped} | {day} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(print(matrix_table()))
