"""Third-party guards from the autograd_guard.guards entry-point group, installed as real
distributions (dist-info folders) in a temporary site directory, in child interpreters."""

from __future__ import annotations

import re
import sys

import pytest
from helpers import run_python

GOOD = """
from autograd_guard.guard import Guard, Target

class TripleGuard(Guard):
    name = "triple"
    symptom = "thirdtarget.double doubles; the user wanted triple"
    remedy = "call thirdtarget.triple"
    targets = (Target("thirdtarget", "double"),)

    def handle(self, call):
        if self.report(call, "triple", "double() tripled"):
            return call.proceed() * 3 // 2
        return call.proceed()
"""


def distribution(site, name, entry_points, modules):
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[autograd_guard.guards]\n" + entry_points)
    for module, source in modules.items():
        (site / f"{module}.py").write_text(source)


@pytest.fixture
def site(tmp_path):
    site = tmp_path / "site"
    distribution(
        site,
        "tripleguard",
        "triple = tripleguard:TripleGuard\n",
        {"tripleguard": GOOD, "thirdtarget": "def double(x):\n    return 2 * x\n"},
    )
    distribution(
        site,
        "brokenguard",
        "broken = brokenguard:BrokenGuard\n",
        {"brokenguard": "raise ImportError('brokenguard needs a missing library')\n"},
    )
    return site


CALL = "import sys, thirdtarget; print(thirdtarget.double(2), 'tripleguard' in sys.modules)"


def test_found_applied_and_broken_one_isolated(site, tmp_path):
    result = run_python(sys.executable, CALL, tmp_path, AUTOGRAD_GUARD="1", PYTHONPATH=str(site))
    assert result.stdout.split() == ["6", "True"]  # guarded by the third-party guard
    assert "[triple/triple] double() tripled" in result.stderr
    assert result.stderr.count("'broken' from brokenguard failed to load") == 1
    again = run_python(sys.executable, CALL, tmp_path, AUTOGRAD_GUARD="1", PYTHONPATH=str(site))
    assert again.stdout.split() == ["6", "True"]  # from the entry-point cache this time


def test_doctor_lists_them_with_their_distribution(site, tmp_path):
    result = run_python(
        sys.executable,
        "from autograd_guard.cli import main; main(['doctor'])",
        tmp_path,
        PYTHONPATH=str(site),
    )
    # the name column is as wide as the longest guard name (doctor lines the modes up)
    assert re.search(r"\n  triple +third-party guard from tripleguard\n", result.stdout)
    assert re.search(r"\n  broken +third-party guard from brokenguard: UNAVAILABLE", result.stdout)


def test_switched_off_by_name(site, tmp_path):
    result = run_python(
        sys.executable,
        CALL,
        tmp_path,
        AUTOGRAD_GUARD="1",
        AUTOGRAD_GUARD_DISABLE="triple",
        PYTHONPATH=str(site),
    )
    assert result.stdout.split() == ["4", "False"]  # not applied, not even imported
    (tmp_path / "autograd_guard.toml").write_text("[guards.triple]\nenabled = false\n")
    result = run_python(sys.executable, CALL, tmp_path, AUTOGRAD_GUARD="1", PYTHONPATH=str(site))
    assert result.stdout.split()[0] == "4"


def test_a_guard_that_breaks_while_starting_is_isolated(site, tmp_path):
    distribution(
        site,
        "startfail",
        "startfail = startfail:StartFail\n",
        {
            "startfail": """
from autograd_guard.guard import Guard

class StartFail(Guard):
    name = "startfail"

    def __init__(self, policy):
        raise RuntimeError("cannot start")
"""
        },
    )
    result = run_python(sys.executable, CALL, tmp_path, AUTOGRAD_GUARD="1", PYTHONPATH=str(site))
    assert result.stdout.split() == ["6", "True"]  # the other guard still works
    assert "guard 'startfail' could not start; it is off" in result.stderr
