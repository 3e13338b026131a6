"""grad_audit on by default: what users' programs do that its re-runs must not disturb,
and backwards that differ from the derivative by design (a reviewer's reproducers)."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import Function

import autograd_guard
from autograd_guard._common import STATE
from autograd_guard.testing import capture_events


def guarded(step, mode="observe", **options):
    """``step()``'s result and the events (the exit note included, the summary aside)."""
    autograd_guard.install({"mode": mode, "guards": {"grad_audit": options}})
    try:
        with capture_events() as events:
            result = step()
            next(g for g in STATE.guards if g.name == "grad_audit")._exit_note()
    finally:
        autograd_guard.uninstall()
    return result, [e for e in events if e["action"] != "summary"]


def actions(events):
    return [e["action"] for e in events if e["action"] != "audit_skipped"]


def note(events):
    return " ".join(e["event"] for e in events if e["action"] == "audit_skipped")


# -- 1. side effects through arguments -------------------------------------------------


class RunningCenter(Function):
    calls = 0

    @staticmethod
    def forward(ctx, x, module):
        RunningCenter.calls += 1
        mean = x.mean(0)
        module.running_mean.mul_(0.9).add_(0.1 * mean)  # BatchNorm-style running stats
        return x - mean

    @staticmethod
    def backward(ctx, g):
        return g - g.mean(0), None


class NoisyScale(Function):
    @staticmethod
    def forward(ctx, x, generator):
        noise = torch.randn(x.shape, generator=generator)
        ctx.save_for_backward(noise)
        return x * (1 + 0.1 * noise)

    @staticmethod
    def backward(ctx, g):
        (noise,) = ctx.saved_tensors
        return g * (1 + 0.1 * noise), None


def running_center():
    RunningCenter.calls = 0
    module = torch.nn.BatchNorm1d(4)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    RunningCenter.apply(x, module).pow(2).sum().backward()
    return RunningCenter.calls, module.running_mean.clone()


def noisy_scale():
    generator = torch.Generator().manual_seed(123)
    NoisyScale.apply(torch.ones(5, requires_grad=True), generator).sum().backward()
    return torch.randn(3, generator=generator)


def test_a_forward_given_a_module_runs_once_and_its_buffer_moves_once():
    expected = running_center()
    (calls, mean), events = guarded(running_center)
    assert calls == expected[0] == 1 and torch.equal(mean, expected[1])
    assert actions(events) == [] and "an argument the forward may change" in note(events)


def test_the_user_s_own_generator_is_not_advanced():
    expected = noisy_scale()
    got, events = guarded(noisy_scale)
    assert torch.equal(expected, got) and actions(events) == []


# -- 2. backwards that differ from the derivative by design ----------------------------


class GradReverse(Function):
    @staticmethod
    def forward(ctx, x, weight):
        ctx.weight = weight
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g.neg() * ctx.weight, None


class GradMultiply(Function):  # fairseq's, verbatim logic
    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.new(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


class ClampSTE(Function):
    @staticmethod
    def forward(ctx, x):
        return x.clamp(-1, 1)

    @staticmethod
    def backward(ctx, g):
        return g


class DummyWgrad(Function):  # Megatron-style: the weight's gradient goes to main_grad
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        w.main_grad.add_(g.t() @ x)
        return g @ w, torch.zeros_like(w)


def by_design(function, *extra):
    def step():
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
        (function.apply(2 * x, *extra) * torch.linspace(-1, 2, 8)).sum().backward()
        return x.grad

    return step


@pytest.mark.parametrize(
    ("function", "extra"), [(GradReverse, (1.0,)), (GradMultiply, (0.1,)), (ClampSTE, ())]
)
def test_a_copy_or_a_straight_through_backward_is_silent_and_unchanged(function, extra):
    expected = by_design(function, *extra)()
    got, events = guarded(by_design(function, *extra), mode="strict")
    assert actions(events) == [] and torch.equal(expected, got)


def dummy_wgrad():
    w = torch.randn(4, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    w.main_grad = torch.zeros_like(w)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(2), requires_grad=True)
    DummyWgrad.apply(x, w).pow(2).sum().backward()
    return w.main_grad


def test_a_dummy_gradient_is_named_with_the_skip_option_in_the_remedy():
    _, events = guarded(dummy_wgrad)
    [event] = [e for e in events if e["action"] == "wrong_gradient"]
    assert "skip" in event["remedy"] and event["function"].endswith("DummyWgrad")


@pytest.mark.parametrize("pattern", [f"{__name__}.DummyWgrad", "test_grad_audit_s*.Dummy*"])
def test_the_skip_option_exempts_a_function_by_name_or_pattern(pattern):
    _, events = guarded(dummy_wgrad, skip=[pattern])
    assert actions(events) == []


def test_a_bad_skip_option_is_refused_naming_the_key():
    with pytest.raises(Exception, match=r"skip.*list of strings"):
        autograd_guard.install({"guards": {"grad_audit": {"skip": "megatron.*"}}})
    autograd_guard.uninstall()
