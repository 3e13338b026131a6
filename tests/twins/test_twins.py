"""The twin-run corpus (issue 19): each program in ``cases/`` runs unguarded and guarded, the
guard started by the real ``.pth`` of the built wheel in a fresh venv, and the guarded run
must do exactly what the unguarded one did, except for the remedy it declares and logs.

Every run of the selected cases starts at once on a small pool (``TWINS_WORKERS``, 2 by
default); each test waits for its own runs. The cases that need compiled code which is not
always there (``requires``: PyTorch3D's ``_C``) run in tests/test_pytorch3d_twins.py, in
the cell that has it, with the same runner and the same comparison."""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import thirdparty
from helpers import ipex_standin
from twin_cases import CONDITIONS, MODES, Case, all_cases
from twin_compare import differences, outcome_differences
from twin_runner import Outcome, run

ALL_CASES = all_cases()
CASES = [case for case in ALL_CASES if not case.compiled()]
# Guards whose remedy only a CUDA device needs, so that no CPU program can show an event:
# each must still have a case named after it, run in every mode, where it stays silent
# and the program is unchanged (the guard out of the CPU's way).
CUDA_ONLY = {
    "pytorch3d_bin_overflow": "only the CUDA coarse rasterizer drops the faces of an "
    "overflowing bin; the CPU one raises instead (scripts/gpu_pytorch3d_bin_overflow.py "
    "shows the event on a GPU)",
}
WORKERS = int(os.environ.get("TWINS_WORKERS", "2"))


class Runs:
    """The child runs of the selected cases, started together."""

    def __init__(self, python: Path, root: Path, cases: list[Case]) -> None:
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="twin")
        self.futures: dict[tuple[str, str], Future[Outcome]] = {}
        # The unguarded runs first: they fill the kernel caches (Warp, inductor) that the
        # other runs of the same case then read instead of compiling at the same time.
        runs = [(c, v) for c in cases for v in c.variants()]
        runs.sort(key=lambda run: run[1] != "plain")
        for case, variant in runs:
            paths = [str(_library(name, root)) for name in case.libraries]
            self.futures[case.name, variant] = self.pool.submit(
                run, case, variant, python, root, paths
            )

    def outcomes(self, case: Case) -> dict[str, Outcome]:
        return {v: self.futures[case.name, v].result() for v in case.variants()}


def _library(name: str, root: Path) -> Path:
    if name.startswith("ipex-"):
        site = root / name
        return site if site.exists() else ipex_standin(site, name.partition("-")[2])
    return thirdparty.install(name)


def started_runs(request: pytest.FixtureRequest, test: str, python: Path, root: Path) -> Runs:
    """The runs of the cases that the session's selected ``test`` items take."""
    selected = [
        item.callspec.params["case"]
        for item in request.session.items
        if getattr(item, "originalname", None) == test
        and not item.callspec.params["case"].unmet()  # skipped: no runs
    ]
    return Runs(python, root, selected)


@pytest.fixture(scope="session")
def twin_runs(request: pytest.FixtureRequest, guard_python: Path, tmp_path_factory):
    runs = started_runs(request, "test_twin", guard_python, tmp_path_factory.mktemp("twins"))
    yield runs
    runs.pool.shutdown(cancel_futures=True)


def case_param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
    if case.unmet():  # asked once per case, at collection
        marks.append(pytest.mark.skip(reason=case.unmet()))
    return pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("case", [case_param(c) for c in CASES])
def test_twin(case: Case, twin_runs: Runs) -> None:
    compare_twins(case, twin_runs.outcomes(case))


def compare_twins(case: Case, outcomes: dict[str, Outcome]) -> None:
    """Fail where a guarded run did what its reference did not (or the hand fix nothing)."""
    problems = []
    if "handfix" in outcomes and not outcome_differences(outcomes["plain"], outcomes["handfix"]):
        problems.append("the hand fix changes nothing: the case shows no bug to remedy")
    for mode, expected in case.modes.items():
        problems += differences(outcomes[expected.like], outcomes[mode], expected)
    if problems:
        streams = "\n".join(
            f"--- {o.variant}: exit {o.returncode} ({o.seconds:.1f} s)\n{o.stderr[-3000:]}"
            for o in outcomes.values()
        )
        pytest.fail(f"{case.name}: {case.doc}\n" + "\n".join(problems) + "\n" + streams)


def test_the_corpus_covers_every_guard_and_mode() -> None:
    from autograd_guard.guards import available

    assert len(ALL_CASES) >= 40
    logged = {e.partition("/")[0] for c in ALL_CASES for x in c.modes.values() for e in x.events}
    guards = {g.name for g in available()}
    missing = guards - set(CUDA_ONLY) - logged
    assert not missing, f"no case shows these guards at work: {sorted(missing)}"
    stale = set(CUDA_ONLY) - (guards - logged)
    assert not stale, f"CUDA_ONLY names guards that do not exist or a case shows: {sorted(stale)}"
    for guard, why in CUDA_ONLY.items():
        silent = [
            c.name
            for c in ALL_CASES
            if c.name.startswith(guard + "_")
            and set(c.modes) == set(MODES)
            and not c.xfail
            and not any(x.events or x.raises for x in c.modes.values())
        ]
        assert silent, f"{guard} ({why}): no case named {guard}_* silent in every mode"
    assert {m for c in ALL_CASES for m in c.modes} == set(MODES)
    # A case run only where a condition holds has a twin for where it does not: on every
    # interpreter some case shows that guard (at work, or out of the way).
    conditions = {r for c in ALL_CASES for r in c.requires if r in CONDITIONS}
    lone = {r for r in conditions if r.removeprefix("no_") == r and f"no_{r}" not in conditions}
    assert not lone, f"no case declares the opposite of these conditions: {sorted(lone)}"
