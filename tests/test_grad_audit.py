"""grad_audit against correct and wrong autograd Functions (tests/grad_audit_corpus.py):
the clean corpus silent and bit-identical in every mode; the bug cases named at their
first call, at the user's line, in observe, fix and strict; its cost after the first calls
(one dict lookup), its options, its undo, and torch.compile."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import grad_audit_corpus as corpus
import pytest
import torch
from helpers import assert_attached
from packaging.version import Version as _Version

import autograd_guard
from autograd_guard._common import STATE
from autograd_guard.errors import GuardError
from autograd_guard.guards.grad_audit.calls import class_key
from autograd_guard.testing import capture_events

# torch 2.1's Dynamo breaks the graph at a hooked Function: grad_audit stands down below 2.2.
pytestmark = [
    *globals().get("pytestmark", []),
    pytest.mark.skipif(
        _Version(__import__("torch").__version__.split("+")[0]) < _Version("2.2"),
        reason="grad_audit stands down on torch < 2.2",
    ),
]

MODES = ("observe", "fix", "strict")


def the_guard():
    return next(g for g in STATE.guards if g.name == "grad_audit")


def identical(expected, got):
    """The same gradients, bit for bit (None where a leaf got none)."""
    return len(expected) == len(got) and all(
        (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
        for a, b in zip(expected, got, strict=True)
    )


def run(case, seed=1, policy=None):
    """The gradients of ``case`` and the events it logged (the exit summary aside)."""
    if policy is not None:
        autograd_guard.install(policy)
        assert_attached("grad_audit", "torch.autograd.function")
    try:
        with capture_events() as events:
            torch.manual_seed(0)
            grads = case(seed)
    finally:
        if policy is not None:
            autograd_guard.uninstall()
    return grads, [e for e in events if e["action"] != "summary"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(corpus.CLEAN))
def test_the_clean_corpus_is_silent_and_bit_identical(name, mode):
    expected, _ = run(corpus.CLEAN[name])
    got, events = run(corpus.CLEAN[name], policy={"mode": mode})
    assert events == []
    assert identical(expected, got)


def test_the_clean_corpus_is_audited_not_skipped():
    """The audit really ran on the Functions it can audit (a silent corpus that was never
    audited would prove nothing); the injector is the one skipped, with its reason."""
    from autograd_guard.guards.grad_audit import audit as _audit

    judged = []
    original = _audit.Audit.judge

    def judge(self, grad_inputs, grad_outputs):
        judged.append(original(self, grad_inputs, grad_outputs))
        return judged[-1]

    _audit.Audit.judge = judge
    try:
        for name in ("tanh", "relu", "abs", "clamp", "max", "float32_only"):
            judged.clear()
            run(corpus.CLEAN[name], policy={"mode": "observe"})
            [verdicts] = judged
            assert verdicts and not isinstance(verdicts, str), name
            assert not any(p.wrong(kind) for _, p, kind in verdicts), name
        judged.clear()
        autograd_guard.install({"mode": "observe"})
        corpus.CLEAN["injector"](1)
        # an injector whose library call is the tests' own code: not re-run
        why = the_guard().skipped["grad_audit_corpus.Injector"]
        assert why.startswith("an injector") and "not an installed library" in why, why
        corpus.CLEAN["dropout"](1)
        assert "a random forward" in the_guard().skipped["grad_audit_corpus.Dropout"]
        corpus.CLEAN["adjoint"](1)  # given its module: a re-run could change it
        assert "may change" in the_guard().skipped["grad_audit_corpus.Adjoint"]
        autograd_guard.uninstall()
    finally:
        _audit.Audit.judge = original


@pytest.mark.parametrize("mode", ("observe", "fix"))
@pytest.mark.parametrize("name", sorted(corpus.BUGS))
def test_each_bug_is_named_at_its_first_call_and_no_gradient_changes(name, mode):
    case, action = corpus.BUGS[name]
    expected, _ = run(case)
    got, events = run(case, policy={"mode": mode})
    [event] = events
    assert event["action"] == action and event["guard"] == "grad_audit"
    assert event["callsite"].startswith(corpus.__file__)  # the line that called the Function
    assert identical(expected, got)


@pytest.mark.parametrize("name", sorted(corpus.BUGS))
def test_strict_raises_at_the_first_call(name):
    case, _ = corpus.BUGS[name]
    autograd_guard.install({"mode": "strict"})
    try:
        with pytest.raises(GuardError, match=r"\[grad_audit\]"):
            case(1)
    finally:
        autograd_guard.uninstall()


def test_the_wrong_sign_event_names_the_function_the_input_and_the_error():
    _, [event] = run(corpus.BUGS["wrong_sign"][0], policy={"mode": "observe"})
    assert event["function"] == "grad_audit_corpus.WrongSign"
    assert "(argument 1, float64)" in event["event"] and "relative error of 2" in event["event"]
    assert "gradcheck" in event["remedy"]


def line_of(text):
    lines = Path(corpus.__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_the_cut_names_the_user_s_call_of_checkpoint():
    case = corpus.BUGS["checkpoint_reentrant_list"][0]
    _, [event] = run(case, policy={"mode": "observe"})
    assert event["callsite"] == f"{corpus.__file__}:{line_of('out = checkpoint(segment')}"
    assert event["function"] == "torch.utils.checkpoint.CheckpointFunction"
    assert "inside a list" in event["event"] and "use_reentrant=False" in event["remedy"]


def test_an_aux_loss_in_a_list_beside_a_tracked_output_is_named_and_its_gradient_lost():
    """A reviewer's MoE block under reentrant checkpoint: ``return h, [aux_loss]``. The
    bug is real (the weights get only h's share unguarded), and the call is named."""
    case = corpus.BUGS["checkpoint_reentrant_aux_list"][0]
    right, _ = run(corpus.CLEAN["checkpoint_reentrant_aux_tuple"])
    wrong, [event] = run(case, policy={"mode": "observe"})
    assert not torch.allclose(right[1], wrong[1])  # lin.weight
    assert event["action"] == "cut_gradient"
    assert event["function"] == "torch.utils.checkpoint.CheckpointFunction"
    assert "1 tensor inside a list beside the outputs torch tracks" in event["event"]
    assert event["callsite"] == f"{corpus.__file__}:{line_of('out = checkpoint(segment')}"


def test_the_residual_beside_a_backward_that_zeroes_its_incoming_gradient_is_wrong():
    """The bug is real: the residual branch's gradient is lost unguarded (x's gradient is
    only the Function's share), and the guard names it without changing it."""
    x, w = corpus._inputs(1)
    (x + corpus.Tanh.apply(x, w)).pow(2).sum().backward()
    right = x.grad.clone()
    wrong = corpus.residual_zeroed(1)[0]
    assert not torch.allclose(right, wrong)


def test_after_the_first_calls_a_class_costs_one_dict_lookup():
    torch_s = vars(torch.autograd.Function)["apply"]  # in C from torch 2.15
    autograd_guard.install({"mode": "observe"})
    try:
        hook = the_guard()._hook
        for seed in range(4):
            corpus.tanh(seed)
        assert corpus.Tanh in hook.done
        assert the_guard()._audited[class_key(corpus.Tanh)] == 3  # "audits", by default
        apply = vars(torch.autograd.Function)["apply"].__func__
        assert apply.__name__ == "apply" and apply.__wrapped__ is not None
    finally:
        autograd_guard.uninstall()
    assert vars(torch.autograd.Function)["apply"] is torch_s  # torch's own, put back


def test_the_caller_s_random_streams_are_left_as_they_were():
    def draws(policy):
        random.seed(3)
        _, events = run(corpus.CLEAN["dropout"], policy=policy)
        return torch.rand(4), random.random(), events

    expected, python, _ = draws(None)
    got, python_guarded, events = draws({"mode": "observe"})
    assert torch.equal(expected, got) and python == python_guarded and events == []


@pytest.mark.parametrize(
    ("audit", "caught"),
    [("everywhere", {"wrong_gradient", "cut_gradient"}), ("patched", {"cut_gradient"})],
)
def test_the_audit_option_narrows_the_scope(audit, caught):
    policy = {"mode": "observe", "guards": {"grad_audit": {"audit": audit}}}
    found = set()
    for name in ("wrong_sign", "checkpoint_reentrant_list"):
        found |= {e["action"] for e in run(corpus.BUGS[name][0], policy=policy)[1]}
    assert found == caught


def test_off_switches_the_audit_off_and_the_structural_checks_stay():
    policy = {"mode": "observe", "guards": {"grad_audit": {"audit": "off"}}}
    assert run(corpus.BUGS["wrong_sign"][0], policy=policy)[1] == []
    [event] = run(corpus.BUGS["zeroes_grad_output"][0], policy=policy)[1]
    assert event["action"] == "grad_output_modified"


def test_audits_zero_audits_nothing():
    policy = {"mode": "observe", "guards": {"grad_audit": {"audits": 0}}}
    assert run(corpus.BUGS["wrong_sign"][0], policy=policy)[1] == []


def test_a_bad_option_is_refused_with_its_key():
    with pytest.raises(Exception, match=r"audit.*everywhere"):
        autograd_guard.install({"guards": {"grad_audit": {"audit": "all"}}})
    autograd_guard.uninstall()


def test_uninstall_restores_torch_s_apply():
    before = vars(torch.autograd.Function)["apply"]
    autograd_guard.install({"mode": "observe"})
    assert vars(torch.autograd.Function)["apply"] is not before
    autograd_guard.uninstall()
    assert vars(torch.autograd.Function)["apply"] is before


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_sees_through_it_and_nothing_changes(backend):
    torch._dynamo.reset()

    def step(x, w):
        return (corpus.WrongSign.apply(x, w) * 2).sum()

    def compiled_run(policy):
        torch._dynamo.reset()
        from torch._dynamo.utils import counters

        counters.clear()
        x, w = corpus._inputs(5)
        grads, events = run(
            lambda seed: corpus._grads(torch.compile(step, backend=backend)(x, w), x, w),
            policy=policy,
        )
        return grads, events, sum(counters["graph_break"].values())

    expected, _, breaks = compiled_run(None)
    got, events, breaks_guarded = compiled_run({"mode": "strict"})
    # compiled: Dynamo traces the Function itself; the guard stands down there
    assert events == [] and breaks_guarded == breaks
    assert identical(expected, got)


def test_a_tensor_subclass_or_a_transform_is_left_alone():
    autograd_guard.install({"mode": "strict"})
    try:
        x, w = corpus._inputs(1)
        grad = torch.func.grad(lambda x: corpus.Tanh.apply(x, w.detach()).sum())
        assert grad(x.detach()).shape == x.shape  # functorch (setup_context absent: torch raises)
    except RuntimeError as exc:
        assert "setup_context" in str(exc)
    finally:
        autograd_guard.uninstall()
    assert "torch" in sys.modules


def test_random_trials_of_the_clean_corpus_raise_no_false_alarm_and_the_bugs_are_caught():
    """Shapes, scales and values drawn from 20 seeds per case (the full measurement, 1,000
    per case, is scripts/grad_audit_false_alarms.py)."""
    policy = {"mode": "observe"}
    for name, case in corpus.CLEAN.items():
        for seed in range(100, 120):
            assert run(case, seed, policy=policy)[1] == [], (name, seed)
    for name, (case, action) in corpus.BUGS.items():
        for seed in range(100, 120):
            if action == "wrong_gradient" and corpus._inputs(seed)[0].abs().max() > 20:
                continue  # a saturated tanh (seeds 112, 115): the bug changes ~nothing there
            assert [e["action"] for e in run(case, seed, policy=policy)[1]] == [action], name


def test_a_class_called_only_without_grad_is_done_after_its_first_calls_too():
    autograd_guard.install({"mode": "observe"})
    try:
        x, _ = corpus._inputs(1)
        with torch.no_grad():
            for _ in range(64):
                corpus.Relu.apply(x)
        assert corpus.Relu in the_guard()._hook.done
    finally:
        autograd_guard.uninstall()


def test_the_real_backward_is_judged_not_a_private_re_run():
    """Two calls of a Function whose backward reads a buffer the forward shares: the first
    call's backward reads the second call's buffer. torch's gradcheck of one call passes;
    the audit judges the backward training ran, and its re-runs leave the buffer as the
    real forward left it (the gradients are bit-identical to the unguarded run)."""
    x, w = corpus._inputs(3, torch.float64)
    assert torch.autograd.gradcheck(corpus.SharedBuffer.apply, (x, w))
    case = corpus.BUGS["shared_buffer"][0]
    expected, _ = run(case, 3)
    got, events = run(case, 3, policy={"mode": "fix"})
    assert [e["action"] for e in events] == ["wrong_gradient"] and identical(expected, got)
    assert events[0]["function"] == "grad_audit_corpus.SharedBuffer"


def test_skipped_audits_are_in_the_status_not_an_event():
    # correct code produces no event: why an audit was skipped is the status's note
    autograd_guard.install({"mode": "observe"})
    try:
        with capture_events() as events:
            corpus.CLEAN["injector"](1)
            corpus.CLEAN["dropout"](1)
        notes = autograd_guard.status()["guards"]["grad_audit"]["notes"]
    finally:
        autograd_guard.uninstall()
    assert [e for e in events if e["action"] != "summary"] == []
    skipped = notes["audits_skipped"]
    assert skipped["grad_audit_corpus.Injector"].startswith("an injector"), skipped
    assert "a random forward" in skipped["grad_audit_corpus.Dropout"], skipped


def test_a_graph_break_beside_the_function_changes_nothing():
    def step(x, w):
        y = corpus.Tanh.apply(x, w)
        torch._dynamo.graph_break()
        return (corpus.WrongSign.apply(y, w) * 2).sum()

    def compiled_run(policy):
        torch._dynamo.reset()
        x, w = corpus._inputs(5)
        return run(
            lambda seed: corpus._grads(torch.compile(step, backend="eager")(x, w), x, w),
            policy=policy,
        )

    expected, _ = compiled_run(None)
    got, events = compiled_run({"mode": "strict"})
    assert events == [] and identical(expected, got)


@pytest.mark.parametrize(
    ("numbers", "wrong"),
    [
        ((-1.0, 1.0, 1.0, 1.0, 1.0), True),  # a wrong sign, smooth and stable: counted
        ((0.5, 1.0, 1.0, 1.0, 1.0), True),  # half the gradient (a term missing)
        ((0.95, 1.0, 1.0, 1.0, 1.0), False),  # 5 %: a solver's gradient, not counted
        ((-1.0, 1.0, 1.0, 1.6, 0.4), False),  # one-sided differences disagree: a kink
        ((-1.0, 1.0, 0.8, 1.0, 1.0), False),  # h and h/2 disagree: truncation error
        ((-1e-6, 1e-6, 1e-6, 1e-6, 1e-6), False),  # below the floor: noise
        ((0.0, float("nan"), 1.0, 1.0, 1.0), False),  # not finite: inconclusive
    ],
)
def test_a_discrepancy_counts_only_where_the_difference_is_trustworthy(numbers, wrong):
    from autograd_guard.guards.grad_audit.verdict import Projections

    projections = Projections(*numbers, scale=1.0)
    assert projections.wrong("float64") is wrong
