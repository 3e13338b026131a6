"""A non-finite loss is said in every mode, whether or not its gradients are finite: the
loss's value, the backward call's line, then the op that made it and its line
(``nonfinite_origin``, from the next forward pass). Child interpreters, through the
built wheel's ``.pth``; and in-process, a correct loop says nothing."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import run_python

from autograd_guard.testing import capture_events, guarded

# log(relu(x)) where relu gives 0: the loss is -inf, every gradient finite (relu's is 0)
LOG_RELU = """
import torch
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
bad = 0
for step in range(20):
    optimizer.zero_grad()
    x = model(torch.randn(8, 3))
    loss = torch.log(torch.relu(x)).mean()
    bad += not bool(loss.isfinite())
    loss.backward()
    assert all(bool(p.grad.isfinite().all()) for p in model.parameters())
    optimizer.step()
print(bad)
"""
BACKWARD_LINE = 12  # the line of loss.backward() in LOG_RELU's program
LOG_LINE = 10


@pytest.mark.parametrize("mode", ["observe", "fix", "strict"])
def test_a_nonfinite_loss_with_finite_gradients_is_said_with_its_op(guard_python, project, mode):
    log = project / "events.jsonl"
    result = run_python(
        guard_python, LOG_RELU, project, AUTOGRAD_GUARD=mode, AUTOGRAD_GUARD_LOG=str(log)
    )
    assert int(result.stdout) > 0  # the loop does make non-finite losses, and runs on
    events = [json.loads(line) for line in log.read_text().splitlines()]
    said = [e for e in events if e["action"] == "nonfinite_loss"]
    assert len(said) == 1 and said[0]["callsite"].endswith(f"<string>:{BACKWARD_LINE}")
    assert "-inf" in said[0]["event"]
    origin = [e for e in events if e["action"] == "nonfinite_origin"]
    assert len(origin) == 1, origin
    assert origin[0]["op"] == "torch.log"
    assert origin[0]["forward"].endswith(f"<string>:{LOG_LINE}")


def test_a_oneoff_nonfinite_loss_is_said_and_the_origin_says_why_not(guard_python, project):
    code = """
    import torch
    w = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([w], lr=0.1)
    for step in range(4):
        optimizer.zero_grad()
        scale = float("nan") if step == 1 else 1.0
        loss = (w * 0).sum() + scale * 0 + (w ** 2).sum() * 0 + (w.sum() + scale - scale)
        loss.backward()
        optimizer.step()
    """
    result = run_python(guard_python, code, project, AUTOGRAD_GUARD="fix")
    events = result.stderr.replace("\n    ", " ").splitlines()  # each event's layers joined
    assert any("[grad_health/nonfinite_loss]" in line and "NaN" in line for line in events)
    origin = [line for line in events if "[grad_health/nonfinite_origin]" in line]
    assert len(origin) == 1 and "one-off" in origin[0], result.stderr
    assert "AUTOGRAD_GUARD=fix" not in origin[0]  # it runs in fix: no advice to


def test_a_finite_loss_says_nothing():
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with guarded({"mode": "fix"}), capture_events() as events:
        for _ in range(5):
            optimizer.zero_grad()
            model(torch.randn(4, 3)).pow(2).mean().backward()
            optimizer.step()
    assert events == []
    assert torch.Tensor.backward.__module__ == "torch._tensor"  # put back at uninstall


def test_a_loss_on_the_meta_device_says_nothing():
    """A meta loss holds no value (a model's shapes traced on ``meta``): nothing is read,
    no guard_error."""
    w = torch.nn.Parameter(torch.ones(3, device="meta"))
    with guarded({"mode": "fix"}), capture_events() as events:
        (w * 2).sum().backward()
    assert events == []


@pytest.mark.parametrize("optimizer_class", [torch.optim.Adam, torch.optim.SGD])
def test_observe_names_the_forward_op_not_the_optimizer_s_update(optimizer_class):
    """observe lets a NaN gradient through: the weights turn NaN in the optimizer's update,
    and the next loss is NaN. The loss's origin names the forward pass's first op given a
    NaN (the weights'), never the update inside step() (Adam's lerp_, SGD's add_)."""
    model = torch.nn.Linear(3, 1)
    optimizer = optimizer_class(model.parameters(), lr=0.01)
    x = torch.randn(4, 3)
    with guarded({"mode": "observe"}), capture_events() as events:
        for step in range(5):
            optimizer.zero_grad()
            out = model(x)
            scale = 0.0 if step == 0 else 1.0  # sqrt's backward at 0: a NaN gradient once
            (out.pow(2).mean() + torch.sqrt((out * scale).pow(2).sum())).backward()
            optimizer.step()
    [origin] = [e for e in events if e["action"] == "nonfinite_origin" and e.get("of") == "loss"]
    assert "lerp" not in origin["event"] and "add_" not in origin["event"]
    assert "linear" in origin["event"] and __file__ in origin["event"]


def test_a_closure_s_forward_inside_step_is_watched():
    """LBFGS runs the forward pass in the closure, inside optimizer.step(): the loss's
    origin names the op there (the optimizer's own update is what is not watched)."""
    w = torch.nn.Parameter(torch.tensor([0.5, -0.2]))
    x = torch.tensor([1.0, 2.0])
    optimizer = torch.optim.LBFGS([w], lr=0.1, max_iter=2)

    def closure():
        optimizer.zero_grad()
        loss = torch.log(w @ x - 1.0)  # log of a negative number: a NaN loss
        loss.backward()
        return loss

    with guarded({"mode": "observe"}), capture_events() as events:
        for _ in range(3):
            optimizer.step(closure)
    [origin] = [e for e in events if e["action"] == "nonfinite_origin" and e.get("of") == "loss"]
    assert "torch.log" in origin["event"] and __file__ in origin["event"]
