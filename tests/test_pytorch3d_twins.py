"""The twin corpus's cases that run PyTorch3D's compiled ``pytorch3d._C`` (``"requires":
["pytorch3d._C"]`` in their ``TWIN``): rasterizers, face normals. Each runs unguarded and
guarded through the real ``.pth`` of the built wheel, with the runner and comparison of
tests/twins/test_twins.py, against the environment's own PyTorch3D.

Needs the real ``pytorch3d._C`` (``nox -s py3.11-torch2.12.0-pytorch3d``, or
``AUTOGRAD_GUARD_TEST_PYTORCH3D=installed`` in an environment with easypytorch3d's
wheel); skipped where only PyTorch3D's Python code is installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("pytorch3d._C")

sys.path.insert(0, str(Path(__file__).resolve().parent / "twins"))

from test_twins import ALL_CASES, Runs, compare_twins, started_runs
from twin_cases import Case

CASES = [case for case in ALL_CASES if "pytorch3d._C" in case.requires]


@pytest.fixture(scope="session")
def compiled_twin_runs(request: pytest.FixtureRequest, guard_python: Path, tmp_path_factory):
    root = tmp_path_factory.mktemp("twins-pytorch3d")
    runs = started_runs(request, "test_pytorch3d_twin", guard_python, root)
    yield runs
    runs.pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_pytorch3d_twin(case: Case, compiled_twin_runs: Runs) -> None:
    outcomes = compiled_twin_runs.outcomes(case)
    # Both runs failing alike (no _C in the child) would compare equal: the program must run.
    plain = outcomes["plain"]
    assert plain.returncode == 0, f"{case.name} fails unguarded:\n{plain.stderr[-3000:]}"
    if case.xfail is None:
        compare_twins(case, outcomes)
        return
    # A known difference, checked to be still there as a strict xfail is (this cell counts
    # an xfail as a skipped test, a failure): once it is gone, drop the case's "xfail".
    with pytest.raises(pytest.fail.Exception):
        compare_twins(case, outcomes)
