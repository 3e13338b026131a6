"""What `python -m pytest` runs: the default run leaves out the slow and downloading tests
(tests/conftest.py's MARKED), CI runs them in a step of its own, a file named on the command
line runs whole, and the README says what the command costs and how to run the rest."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest
from conftest import DEFAULT_SELECTION, MARKED
from helpers import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
README = (ROOT / "README.md").read_text(encoding="utf-8")
CI = (ROOT / ".ci" / "run").read_text()


def test_the_markers_are_registered_and_left_out_by_default():
    options = PYPROJECT["tool"]["pytest"]["ini_options"]
    assert f"-m '{DEFAULT_SELECTION}'" in options["addopts"]
    registered = {line.split(":", 1)[0] for line in options["markers"]}
    assert set(MARKED.values()) <= registered and {"slow", "download"} <= registered
    for key in MARKED:
        assert (ROOT / key.split("::")[0]).is_file(), key


# pytest as its console script runs it: the working directory is not on sys.path, so the
# matrix's cells (which test the installed wheel) never import the checkout's package
PYTEST = [
    sys.executable,
    "-c",
    "import sys; del sys.path[0]; import pytest; sys.exit(pytest.main())",
]


def _collected(*args: str) -> str:
    run = subprocess.run(
        [*PYTEST, "--collect-only", "-q", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_a_folder_leaves_the_marked_out_and_a_named_file_runs_whole():
    twins = _collected("tests/twins")  # a folder: the default selection
    assert "test_twin_compare.py::" in twins and "test_twins.py::" not in twins
    assert re.search(r"\d+/\d+ tests collected \(\d+ deselected\)", twins)
    named = _collected("tests/twins/test_twins.py")  # named: whole
    assert "test_twins.py::" in named and "deselected" not in named
    asked = _collected("-m", "slow", "tests/twins")  # -m: as asked
    assert "test_twins.py::" in asked and "test_twin_compare.py::" not in asked


def test_ci_runs_the_marked_tests_the_docs_and_the_lowest_dependencies():
    lines = CI.splitlines()
    assert 'python -m pytest -m "slow or download"' in lines
    assert "NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --site-dir site" in lines
    assert "python scripts/check_site_links.py site" in lines
    assert "cell py3.11-torch2.13.0-lowest" in lines
    assert "cell typing" in lines  # mypy with the pinned and the newest wrapt


def test_the_lowest_cell_pins_the_lower_bounds_pyproject_declares():
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    [lowest] = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "LOWEST"
    ]
    bounds = {}
    for requirement in PYPROJECT["project"]["dependencies"]:
        found = re.fullmatch(r"([\w-]+)>=([\d.]+)", requirement)
        if found:
            bounds[found.group(1)] = found.group(2)
    assert set(lowest) == set(bounds) == {"wrapt", "structlog", "packaging"}
    for name, version in lowest.items():
        assert version.startswith(bounds[name]), (name, version, bounds[name])


@pytest.mark.parametrize("page", ["README.md", "docs/contributing.md"])
def test_the_docs_say_what_the_test_command_costs_and_how_to_run_the_rest(page):
    text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    assert 'python -m pytest -m "slow or download"' in text
    assert "1.5 GB" in text
    # the times live in one place, contributing's table; the README points there
    if page == "README.md":
        assert "(docs/contributing.md#set-up-and-run-the-tests)" in text
    else:
        assert re.search(r"\d+ min \d+ s", text)
