"""The corpus's comparison finds each kind of difference it promises to (a comparison that
cannot fail would let every twin pass)."""

from __future__ import annotations

import io
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from twin_cases import Case, Expectation, load_case
from twin_compare import differences, outcome_differences, same_tensors, shown_by_default
from twin_runner import Outcome, Warned, run


def saved(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


NON_LEAF = Warned("builtins.UserWarning", "The .grad attribute ...", "<case>/case.py", 12)


def outcome(**changes: object) -> Outcome:
    fields: dict[str, object] = {
        "variant": "plain",
        "folder": Path("/run/plain"),
        "returncode": 0,
        "stdout": "ok\n",
        "stderr": "",
        "exception": None,
        "files": {"result.pt": saved({"x": torch.tensor([1.0, float("nan"), -0.0])})},
        "events": [],
        "seconds": 1.0,
        "warnings": [NON_LEAF],
    }
    fields.update(changes)
    return Outcome(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changed",
    [
        {"returncode": 1},
        {"stdout": "ok \n"},
        {"exception": {"type": "builtins.KeyError", "cause": None, "context": None}},
        {"files": {}},
        {"files": {"result.pt": saved({"x": torch.tensor([1.0, 2.0, -0.0])})}},  # NaN gone
        {"files": {"result.pt": saved({"x": torch.tensor([1.0, float("nan"), 0.0])})}},  # +0
        {"files": {"result.pt": saved({"x": torch.tensor([1.0, float("nan"), -0.0]).double()})}},
        {"files": {"result.pt": saved({"x": torch.tensor([1.0, float("nan"), -0.0]), "y": 1})}},
        {"warnings": []},
        {"warnings": [NON_LEAF, NON_LEAF]},  # once-per-location filtering would hide it
        {"warnings": [NON_LEAF, Warned("builtins.DeprecationWarning", "old", "/t/x.py", 3, True)]},
        {"warnings": [Warned("builtins.UserWarning", "The .grad attribute ...", "/g.py", 96)]},
    ],
)
def test_each_difference_is_found(changed):
    assert outcome_differences(outcome(), outcome(**changed))


def test_equal_runs_and_equal_tensors_saved_apart_are_the_same():
    assert outcome_differences(outcome(), outcome()) == []
    strided = torch.tensor([[1.0, float("nan")], [3.0, 4.0]]).t()
    assert same_tensors(saved([strided]), saved([strided.contiguous()]))


def test_events_must_be_exactly_the_declared_ones_at_the_programs_own_lines():
    event = {"guard": "grad_mode", "action": "enable_grad", "callsite": "/run/fix/case.py:9"}
    guarded = outcome(variant="fix", folder=Path("/run/fix"), events=[event])
    assert differences(outcome(), guarded, Expectation(events=("grad_mode/enable_grad",))) == []
    assert differences(outcome(), guarded, Expectation())  # none declared
    elsewhere = {**event, "callsite": "/venv/torch/nn/modules/module.py:1520"}
    expected = Expectation(events=("grad_mode/enable_grad",))
    assert differences(outcome(), outcome(variant="fix", events=[elsewhere]), expected)
    note = outcome(variant="fix", stderr="autograd-guard error: something\n")
    assert differences(outcome(), note, Expectation())


def test_a_case_declares_its_policy_modes_and_expectations(tmp_path):
    case = tmp_path / "demo.py"
    case.write_text(
        '"""A demo."""\n\nTWIN = {"policy": "x = " + "[" * 3 + "]" * 3, '
        '"modes": {"fix": {"events": ["g/a"], "like": "handfix"}, "strict": {}}}\n'
    )
    loaded = load_case(case)
    assert loaded.policy == "x = [[[]]]" and loaded.doc == "A demo."
    assert loaded.variants() == ["handfix", "plain", "fix", "strict"]
    case.write_text('TWIN = {"mode": "fix"}\n')
    with pytest.raises(ValueError, match="TWIN must be a dict"):
        load_case(case)


def test_warnings_are_a_multiset_and_a_run_that_raises_as_expected_may_issue_fewer():
    other = Warned("builtins.FutureWarning", "soon", "/torch/x.py", 7)
    assert (
        outcome_differences(
            outcome(warnings=[NON_LEAF, other]), outcome(warnings=[other, NON_LEAF])
        )
        == []
    )
    raises = Expectation(raises="autograd_guard.errors.GuardError")
    stopped = {"variant": "strict", "exception": {"type": raises.raises}}
    assert differences(outcome(), outcome(**stopped, warnings=[]), raises) == []
    [problem] = differences(outcome(), outcome(**stopped, warnings=[NON_LEAF, other]), raises)
    assert "/torch/x.py:7: builtins.FutureWarning: soon (x1; shown by default)" in problem


def test_the_default_filters_show_each_location_once_and_hide_deprecations():
    old = Warned("builtins.DeprecationWarning", "old", "/t/x.py", 3, hidden_by_default=True)
    assert shown_by_default([NON_LEAF, old, NON_LEAF]) == [NON_LEAF]
    [problem] = outcome_differences(outcome(), outcome(warnings=[NON_LEAF, old]))
    assert "only under -W always" in problem and "issued 1 warning" in problem


WARNS = textwrap.dedent(
    """
    import warnings

    def main():
        for _ in range(2):
            warnings.warn("twice at one line", UserWarning)
        warnings.warn("old", DeprecationWarning)
        warnings.warn(f"at {object()!r}", FutureWarning)
    """
)


def test_the_child_records_every_warning_each_time_it_is_issued(tmp_path):
    case = Case(name="warns", source=WARNS, doc="")
    warned = run(case, "plain", Path(sys.executable), tmp_path, []).warnings
    twice = Warned("builtins.UserWarning", "twice at one line", "<case>/case.py", 6)
    old = Warned("builtins.DeprecationWarning", "old", "<case>/case.py", 7, True)
    at = Warned("builtins.FutureWarning", "at <object object at 0x?>", "<case>/case.py", 8)
    assert warned == [twice, twice, old, at]
    assert shown_by_default(warned) == [twice, at]
