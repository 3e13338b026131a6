"""The program runs pytest (with warnings as errors) on a test file that calls a guarded
stage: the same outcome and exit code, nothing logged."""

import contextlib
import io

import pytest

TWIN = {
    "policy": """
        [[rules]]
        target = "stages:fit"
        action = "enable_grad"
    """,
    "files": {
        # its own config: the nodeids and options do not depend on where the case runs
        "pytest.ini": "[pytest]\n",
        "stages.py": """
            import torch


            def fit(x):
                x = x.clone().requires_grad_()
                (x * x).sum().backward()
                return x.grad
        """,
        "test_stages.py": """
            import torch
            from stages import fit


            def test_fit():
                assert fit(torch.ones(2)).tolist() == [2.0, 2.0]


            def test_fails():
                assert fit(torch.ones(1)).item() == 3.0
        """,
    },
}


class Outcomes:
    def __init__(self):
        self.results = []

    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            self.results.append((report.nodeid, report.outcome))


def main():
    outcomes = Outcomes()
    with contextlib.redirect_stdout(io.StringIO()):  # its report holds durations
        code = pytest.main(
            ["-q", "-p", "no:cacheprovider", "-W", "error", "test_stages.py"],
            plugins=[outcomes],
        )
    print("exit code", int(code), outcomes.results)
