"""grad_health must never make training worse (issue 18, items 1-10; issue 17, item 2):
each test is a twin run, the same program unguarded and guarded, comparing weights,
optimizer state, what the user's hooks saw, and the events."""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from grad_health_twin import assert_same, hook_log, outcome, twin

import autograd_guard
from autograd_guard._events import actions as _actions
from autograd_guard.testing import capture_events

ORIGINAL_BACKWARD, ORIGINAL_GRAD = torch.autograd.backward, torch.autograd.grad


def sqrt_nan(w: torch.Tensor) -> torch.Tensor:
    """Finite forward (0), NaN backward: sqrt of an exact zero."""
    return torch.sqrt((w * 0).pow(2).sum())


# -- 1. threads -------------------------------------------------------------------------


def thread_program(broken: bool, steps: int = 300) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    model = torch.nn.Linear(8, 1)
    with torch.no_grad():  # not the global generator, which the other thread shares
        model.weight.copy_(torch.randn(1, 8, generator=generator))
        model.bias.zero_()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        optimizer.zero_grad()
        loss = model(torch.randn(16, 8, generator=generator)).pow(2).mean()
        if broken and step % 2:
            loss = loss + sqrt_nan(model.weight)
        loss.backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.fixture
def lockstep_kernel(monkeypatch):
    """Each thread's finiteness kernel waits for the other's before either reads its
    flag: the worst interleaving of two threads, at every step."""
    real = torch._amp_foreach_non_finite_check_and_unscale_
    barrier = threading.Barrier(2)

    def kernel(*args):
        real(*args)
        with contextlib.suppress(threading.BrokenBarrierError):  # the other thread is done
            barrier.wait()

    monkeypatch.setattr(torch, "_amp_foreach_non_finite_check_and_unscale_", kernel)
    return barrier


def test_threads_training_models_of_their_own_never_share_a_flag(lockstep_kernel):
    # One flag for all threads: the healthy model's steps were reported and skipped, and
    # the broken model's NaN got through.
    solo = thread_program(False)

    def both() -> dict[str, list[torch.Tensor]]:
        results: dict[str, list[torch.Tensor]] = {}

        def train(broken: bool) -> None:
            results[str(broken)] = thread_program(broken)
            lockstep_kernel.abort()

        lockstep_kernel.reset()
        threads = [threading.Thread(target=train, args=(b,)) for b in (False, True)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        lockstep_kernel.abort()  # one thread alone from now on
        return results

    bare, guarded, events = twin(both)
    assert_same(bare["False"], solo)
    assert_same(guarded["False"], solo)  # the healthy model: bit-identical
    assert not all(torch.isfinite(p).all() for p in bare["True"])
    assert all(torch.isfinite(p).all() for p in guarded["True"])
    reported = [e for e in events if e["action"] == "nonfinite_gradient"]
    assert reported and all(e["parameters"] in (["weight"], None) for e in reported)


@pytest.mark.parametrize("healthy_backward", ["before", "after"])
def test_a_thread_stepping_while_another_threads_pass_is_recorded_keeps_its_step(
    healthy_backward: str,
):
    # The probe that names a NaN's op, armed by one thread's skipped step, recorded every
    # thread's passes and its "this pass was mended" went to the next step of any thread.
    # A healthy thread's step between the broken thread's recorded pass and its step:
    # with its own backward pass before that pass, the healthy step was taken for
    # non-finite and skipped; after it, the broken step ran on the mended gradients.
    def program() -> dict[str, list[torch.Tensor]]:
        armed, backward_done = threading.Event(), threading.Event()
        recorded, healthy_done = threading.Event(), threading.Event()
        results: dict[str, list[torch.Tensor]] = {}

        def model_of(scale: float) -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
            model = torch.nn.Linear(4, 1)
            with torch.no_grad():
                model.weight.copy_(torch.linspace(-1, 1, 4) * scale)
                model.bias.zero_()
            return model, torch.optim.Adam(model.parameters(), lr=1e-2)

        def broken() -> None:
            model, optimizer = model_of(1.0)
            for step in range(2):
                if step == 1:
                    armed.set()  # its first step was skipped: the probe is armed
                    if healthy_backward == "before":
                        backward_done.wait(30)
                optimizer.zero_grad()
                (model(torch.ones(2, 4)).sum() + sqrt_nan(model.weight)).backward()
                if step == 1:  # its recorded pass is done: the healthy thread steps now
                    recorded.set()
                    healthy_done.wait(30)
                optimizer.step()
            results["broken"] = [p.detach().clone() for p in model.parameters()]

        def healthy() -> None:
            model, optimizer = model_of(2.0)
            (armed if healthy_backward == "before" else recorded).wait(30)
            optimizer.zero_grad()
            model(torch.arange(8.0).reshape(2, 4)).pow(2).sum().backward()
            backward_done.set()
            recorded.wait(30)
            optimizer.step()
            healthy_done.set()
            results["healthy"] = [p.detach().clone() for p in model.parameters()]

        threads = [threading.Thread(target=broken), threading.Thread(target=healthy)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        return results

    bare, guarded, events = twin(program, {"mode": "fix"})
    assert not torch.equal(bare["healthy"][0], torch.linspace(-1, 1, 4)[None] * 2)  # it moved
    assert_same(guarded["healthy"], bare["healthy"])  # its step taken, as unguarded
    assert torch.equal(guarded["broken"][0], torch.linspace(-1, 1, 4)[None])  # both skipped
    assert torch.equal(guarded["broken"][1], torch.zeros(1))
    skipped = [e for e in events if e["action"] == "nonfinite_gradient"]
    assert [e["parameters"] for e in skipped] == [["weight"]]  # the broken model's, once


def test_one_model_whose_backward_runs_in_two_threads_never_steps_on_a_nan():
    # Backward on half the batch in a helper thread, half in the main thread, which steps:
    # the probe (the main thread's) mends the main thread's pass alone, and the repair
    # began on gradients the helper's pass had left NaN (the weights went NaN)
    def program() -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def half(x: torch.Tensor) -> None:
            (model(x).pow(2).mean() + sqrt_nan(model.weight)).backward()

        for _ in range(8):
            optimizer.zero_grad()
            x = torch.randn(8, 4)
            helper = threading.Thread(target=half, args=(x[4:],))
            helper.start()
            helper.join()
            half(x[:4])
            optimizer.step()
        return [p.detach().clone() for p in model.parameters()]

    torch.manual_seed(0)
    initial = [p.detach().clone() for p in torch.nn.Linear(4, 1).parameters()]
    bare, guarded, events = twin(program, {"mode": "fix"})
    assert not all(torch.isfinite(p).all() for p in bare)
    assert_same(guarded, initial)  # every step skipped, as a hand-written skip would
    assert "nonfinite_repaired" not in [e["action"] for e in events]


def test_a_probe_whose_thread_ended_ends_at_another_threads_step():
    # A short job in a thread has one NaN step and ends while its probe records: the probe
    # stayed until exit (anomaly mode on for 30 s, no origin for the main thread's own NaN,
    # no repair), and said "the run ended before another backward pass"
    def side_job() -> None:
        w = torch.nn.Parameter(torch.ones(3))
        optimizer = torch.optim.SGD([w], lr=0.1)
        sqrt_nan(w).backward()
        optimizer.step()

    autograd_guard.install({"mode": "fix"})
    try:
        with capture_events() as events:
            job = threading.Thread(target=side_job)
            job.start()
            job.join()
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            x = torch.randn(64, 4)
            y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
            for _ in range(60):
                optimizer.zero_grad()
                ((model(x) - y).pow(2).mean() + sqrt_nan(model.weight)).backward()
                optimizer.step()
            anomaly = torch.is_anomaly_enabled()
    finally:
        autograd_guard.uninstall()
    origins = [e["event"] for e in events if e["action"] == "nonfinite_origin"]
    assert "no backward pass ran in the thread of that step" in origins[0]
    assert "SqrtBackward0" in origins[1] and not anomaly
    assert "nonfinite_repaired" in [e["action"] for e in events]
    assert float((model(x) - y).detach().pow(2).mean()) < 1e-3  # repaired: it fits


# -- 2. closures evaluated several times ------------------------------------------------


def lbfgs_program(bad_evaluation: int, made: dict[str, object] | None = None) -> dict[str, object]:
    x = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.LBFGS([x], lr=1, max_iter=5)
    if made is not None:
        made.update(x=x, optimizer=optimizer)
    calls = [0]

    def closure() -> torch.Tensor:
        calls[0] += 1
        optimizer.zero_grad()
        loss = ((x - 3) ** 2).sum()
        if calls[0] == bad_evaluation:
            loss = loss + sqrt_nan(x)
        loss.backward()
        return loss

    optimizer.step(closure)
    return outcome([x], optimizer, calls=calls[0])


@pytest.mark.parametrize("bad_evaluation", [1, 2])
def test_lbfgs_a_step_said_skipped_is_skipped_whole(bad_evaluation):
    # The check ran after each closure call; LBFGS re-evaluates after its line search
    # moved x, so a step reported as skipped had moved x (0 -> 3) and n_iter.
    _, guarded, events = twin(lambda: lbfgs_program(bad_evaluation))
    assert_same(guarded["weights"], [torch.zeros(2)])  # x as before the step
    assert guarded["state"][0]["state"] == {}  # LBFGS's state as before the step
    assert guarded["calls"] == bad_evaluation  # the step stopped at the bad evaluation
    [event] = [e for e in events if e["action"] == "nonfinite_gradient"]
    assert "was skipped" in event["event"] and "as before it" in event["event"]


def test_lbfgs_strict_raises_with_the_weights_and_state_as_before_the_step():
    def program() -> dict[str, object]:
        made: dict[str, object] = {}
        try:
            return lbfgs_program(2, made)
        except autograd_guard.GuardError as error:
            return {"error": str(error), **outcome([made["x"]], made["optimizer"])}

    _, guarded, _ = twin(program, {"mode": "strict"})
    error = guarded["error"]
    assert "at evaluation 2 of this LBFGS step's closure: the step was stopped and undone" in error
    assert_same(guarded["weights"], [torch.zeros(2)])
    assert guarded["state"][0]["state"] == {}


class TwiceEvaluated(torch.optim.Optimizer):
    """An optimizer of the user's own that moves the weights between two evaluations."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.5})

    def step(self, closure):
        for _ in range(2):
            closure()
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        if p.grad is not None:
                            p -= group["lr"] * p.grad
        return None


def test_an_optimizer_outside_torch_is_snapshotted_and_undone_whole_from_its_first_step():
    w = torch.nn.Parameter(torch.zeros(2))
    optimizer = TwiceEvaluated([w])
    calls = [0]

    def closure(bad: bool) -> None:
        calls[0] += 1
        optimizer.zero_grad()
        loss = ((w - 1) ** 2).sum() + (sqrt_nan(w) if bad and calls[0] % 2 == 0 else 0)
        loss.backward()

    autograd_guard.install({})
    with capture_events() as events:
        optimizer.step(lambda: closure(True))  # evaluation 2 is not finite
    assert torch.equal(w.detach(), torch.zeros(2))  # evaluation 1's update undone
    assert calls == [2]  # stopped at the bad evaluation
    [event] = events[:1]
    assert "skipped: stopped at evaluation 2 of its closure and undone" in event["event"]
    optimizer.step(lambda: closure(False))  # a healthy step runs whole
    assert torch.equal(w.detach(), torch.ones(2))  # 0 -> 1, then a zero gradient


# -- 3. the user's step hooks see the user's gradients ----------------------------------


def hooked_program(skip_by_hand: bool) -> dict[str, object]:
    w = torch.nn.Parameter(torch.full((3,), 2.0))
    optimizer = torch.optim.Adam([w], lr=0.1)
    log: list[object] = []
    hook_log(optimizer, log)
    for step in range(4):
        optimizer.zero_grad()
        (torch.sqrt(((w - 1) * (step != 2)).pow(2).sum()) + w.sum()).backward()
        if not (skip_by_hand and step == 2):
            optimizer.step()
    return outcome([w], optimizer, log=log, grad=w.grad)


def test_user_step_hooks_see_the_gradients_the_user_had():
    # fix hid the gradients as None for the whole step: a hook logging norms crashed.
    bare, guarded, events = twin(lambda: hooked_program(False))
    assert_same(guarded["log"][:6], bare["log"][:6])  # NaN norms at step 2, as unguarded
    torch.manual_seed(0)
    by_hand = hooked_program(True)  # the NaN step not taken at all
    assert_same(guarded["log"][6:], by_hand["log"][4:])  # then finite, as without it
    assert_same(guarded["grad"], by_hand["grad"])
    assert_same(guarded["weights"], by_hand["weights"])
    assert_same(guarded["state"], by_hand["state"])
    assert [e["action"] for e in events][:1] == ["nonfinite_gradient"]


# -- 4. the localiser in torch.autograd.grad loops ---------------------------------------


def grad_loop(steps: int) -> dict[str, object]:
    w = torch.nn.Parameter(torch.full((3,), 2.0))
    optimizer = torch.optim.SGD([w], lr=0.1)
    for step in range(steps):
        loss = ((w - 1) ** 2).sum() + (sqrt_nan(w) if 1 <= step <= 3 else 0)
        (w.grad,) = torch.autograd.grad(loss, [w])
        optimizer.step()
    return outcome([w], optimizer, anomaly=torch.is_anomaly_enabled())


def test_the_localiser_disarms_in_autograd_grad_loops_and_names_the_op():
    # It counted backward() calls only: anomaly mode and the patched backward stayed on
    # for the rest of the run.
    skip = {"guards": {"grad_health": {"nonfinite_fix": "skip"}}}  # three bad steps: no repair
    bare, guarded, events = twin(lambda: grad_loop(12), skip)
    assert guarded["anomaly"] is bare["anomaly"] is False
    assert torch.autograd.backward is ORIGINAL_BACKWARD
    assert torch.autograd.grad is ORIGINAL_GRAD
    assert [e["action"] for e in events] == ["nonfinite_gradient", "nonfinite_origin"]
    assert events[1]["op"] == "SqrtBackward0"


def edge_loop(steps: int) -> dict[str, object]:
    # torch.distributed.pipelining's stage backward (torch 2.15) passes GradientEdges
    w = torch.nn.Parameter(torch.full((3,), 2.0))
    optimizer = torch.optim.SGD([w], lr=0.1)
    for step in range(steps):
        optimizer.zero_grad()
        loss = ((w - 1) ** 2).sum() + (sqrt_nan(w) if 1 <= step <= 3 else 0)
        edge = torch.autograd.graph.get_gradient_edge(loss)
        torch.autograd.backward([edge], grad_tensors=[torch.ones_like(loss)])
        optimizer.step()
    return outcome([w], optimizer, anomaly=torch.is_anomaly_enabled())


def backward_takes_edges() -> bool:
    """torch.autograd.backward accepts a GradientEdge root (not yet on torch 2.4)."""
    if not hasattr(torch.autograd.graph, "get_gradient_edge"):
        return False
    x = torch.ones(2, requires_grad=True)
    y = (x * 2).sum()
    try:
        torch.autograd.backward([torch.autograd.graph.get_gradient_edge(y)], [torch.ones(())])
    except (AttributeError, TypeError, RuntimeError):
        return False
    return x.grad is not None


@pytest.mark.skipif(
    not backward_takes_edges(), reason="backward() from a GradientEdge: newer torch"
)
def test_the_localiser_follows_a_backward_pass_from_a_gradient_edge():
    # A GradientEdge root broke the probe (no values to check): a guard_error each pass.
    skip = {"guards": {"grad_health": {"nonfinite_fix": "skip"}}}
    bare, guarded, events = twin(lambda: edge_loop(12), skip)
    assert guarded["anomaly"] is bare["anomaly"] is False
    assert [e["action"] for e in events] == ["nonfinite_gradient", "nonfinite_origin"]
    assert events[1]["op"] == "SqrtBackward0"


def test_the_localiser_is_bounded_by_steps_and_time_and_gives_back_the_users_anomaly_mode():
    from autograd_guard.guards.grad_health import probe as _grad_probe

    torch.autograd.set_detect_anomaly(True, check_nan=True)  # the user's own setting
    try:
        probe = _grad_probe.BackwardProbe(passes=100, steps=2, eager=lambda f: f)
        probe.arm()
        assert torch.is_anomaly_enabled() and not torch.is_anomaly_check_nan_enabled()
        assert not probe.step_done() and probe.step_done()  # two optimizer steps
        assert (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()) == (True, True)
        _grad_probe.SECONDS, seconds = 0.0, _grad_probe.SECONDS
        try:
            timed = _grad_probe.BackwardProbe(passes=100, steps=100, eager=lambda f: f)
            timed.arm()  # a program that stops stepping: the timer disarms it
        finally:
            _grad_probe.SECONDS = seconds
        timed._timer.join()
        assert not timed.armed and torch.autograd.grad is ORIGINAL_GRAD
    finally:
        torch.autograd.set_detect_anomaly(False)


# -- 5. only a closure is a closure -----------------------------------------------------


class ScaledSGD(torch.optim.Optimizer):
    """step() takes a learning-rate factor, and a callable that is no closure."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.1})

    def step(self, factor=1.0, schedule=None):
        factor = schedule(factor) if schedule is not None else factor
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p -= group["lr"] * factor * p.grad


def scaled_program() -> dict[str, object]:
    w = torch.nn.Parameter(torch.ones(3))
    optimizer = ScaledSGD([w])
    for _ in range(3):
        optimizer.zero_grad()
        (w**2).sum().backward()
        optimizer.step(0.5)
        optimizer.step(0.5, lambda f: f * 2)
    return outcome([w], optimizer)


def test_a_first_argument_that_is_no_closure_is_passed_as_it_is():
    bare, guarded, events = twin(scaled_program, {"mode": "strict"})
    assert_same(guarded, bare)
    assert events == []


# -- 7. lost gradients: a finding, over a realistic window --------------------------------


class TopOneMoE(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 1) for _ in range(4))

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        # expert 3 gets its first token at step 60
        route = torch.arange(len(x)) % (4 if step >= 60 else 3)
        return torch.cat([self.experts[int(r)](row[None]) for r, row in zip(route, x, strict=True)])


def moe_program() -> dict[str, object]:
    model = TopOneMoE()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(120):
        optimizer.zero_grad()
        model(torch.randn(4, 4), step).pow(2).mean().backward()
        optimizer.step()
    return outcome(model.parameters(), optimizer)


def test_an_expert_that_gets_tokens_within_the_window_is_never_reported():
    bare, guarded, events = twin(moe_program)
    assert_same(guarded, bare)
    assert events == []


def test_a_detached_backbone_is_still_reported_once_as_a_finding():
    class Detached(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone, self.head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.backbone(x).detach())

    def program() -> dict[str, object]:
        model = Detached()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(150):
            optimizer.zero_grad()
            model(torch.randn(4, 4)).pow(2).mean().backward()
            optimizer.step()
        return outcome(model.parameters(), optimizer)

    bare, guarded, events = twin(program)
    assert_same(guarded, bare)
    [event] = events
    assert event["action"] == "lost_gradient" and "100 optimizer steps" in event["event"]
    assert event["parameters"] == ["backbone.weight", "backbone.bias"]
    rows = [{"guard": "grad_health", "action": "lost_gradient", "callsite": "x", "count": 1}]
    assert _actions.describe_counts(rows) == "0 interventions at 0 call sites; 1 finding"


# -- 8. meta and fake tensors, unhashable optimizers --------------------------------------


def test_on_meta_params_strict_leaves_the_optimizers_own_error():
    # torch's test_fused_error_on_params_on_meta: found.item() on meta raised, and in
    # strict the GuardError replaced the optimizer's own error.
    def program() -> dict[str, object]:
        w = torch.nn.Parameter(torch.ones(3, device="meta"))
        w.grad = torch.ones(3, device="meta")
        optimizer = torch.optim.SGD([w], lr=0.1, momentum=0.9)
        try:
            optimizer.step()
        except Exception as exc:
            return {"error": (type(exc), str(exc))}
        return {"error": None, "shape": list(w.shape)}

    bare, guarded, events = twin(program, {"mode": "strict"})
    assert guarded == bare and events == []


def test_fake_tensors_are_not_checked():
    from torch._subclasses.fake_tensor import FakeTensorMode

    def program() -> dict[str, object]:
        with FakeTensorMode():
            w = torch.nn.Parameter(torch.ones(3))
            w.grad = torch.ones(3)
            torch.optim.SGD([w], lr=0.1).step()
            return {"shape": list(w.shape), "kind": type(w).__name__}

    bare, guarded, events = twin(program, {"mode": "strict"})
    assert guarded == bare and events == []


class Comparable(torch.optim.SGD):
    def __eq__(self, other: object) -> bool:  # and so no __hash__
        return self is other


def test_an_unhashable_optimizer_is_checked_like_any_other():
    def program() -> dict[str, object]:
        w = torch.nn.Parameter(torch.ones(3))
        optimizer = Comparable([w], lr=0.1)
        for step in range(3):
            optimizer.zero_grad()
            ((w - 2).pow(2).sum() + (sqrt_nan(w) if step == 1 else 0)).backward()
            optimizer.step()
        return outcome([w], optimizer)

    _, guarded, events = twin(program)
    assert all(torch.isfinite(p).all() for p in guarded["weights"])
    assert [e["action"] for e in events][:1] == ["nonfinite_gradient"]


# -- 9. a run that is not training --------------------------------------------------------


def stuck_program() -> dict[str, object]:
    w = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([w], lr=0.1)
    for _ in range(30):
        optimizer.zero_grad()
        (w.sum() + sqrt_nan(w)).backward()
        optimizer.step()
    return outcome([w], optimizer)


def test_a_run_whose_every_step_is_skipped_is_said_once_not_to_be_training():
    _, guarded, events = twin(stuck_program, {"guards": {"grad_health": {"localize_steps": 0}}})
    assert_same(guarded["weights"], [torch.ones(3)])
    stalled = [e for e in events if e["action"] == "training_stalled"]
    assert len(stalled) == 1 and stalled[0]["level"] == "error"
    assert stalled[0]["steps"] == 20 and "not progressing" in stalled[0]["event"]


# -- 10. messages -------------------------------------------------------------------------


def test_each_action_has_its_own_remedy_and_strict_names_what_it_can():
    def program() -> None:
        model = torch.nn.Sequential(torch.nn.Linear(3, 3))
        cut = torch.nn.Linear(3, 3)  # runs, detached: its gradient is lost
        optimizer = torch.optim.SGD([*model.parameters(), *cut.parameters()], lr=0.1)
        for step in range(103):
            optimizer.zero_grad()
            out = model(torch.ones(1, 3)).sum() + cut(torch.ones(1, 3)).detach().sum()
            (out + (sqrt_nan(out) if step >= 100 else 0)).backward()
            optimizer.step()

    autograd_guard.install({})
    with capture_events() as events:
        program()
    remedies = {e["action"]: e["remedy"] for e in events}
    actions = {"lost_gradient", "nonfinite_gradient", "nonfinite_origin", "nonfinite_repaired"}
    assert remedies.keys() == actions  # three bad steps in a row: the third is repaired
    assert len(set(remedies.values())) == 4
    origin = next(e for e in events if e["action"] == "nonfinite_origin")
    assert " at " not in origin["event"]  # the line format adds " at <call site>"
    autograd_guard.uninstall()
    autograd_guard.install({"mode": "strict"})
    model = torch.nn.Sequential(torch.nn.Linear(3, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sqrt_nan(model(torch.ones(1, 3)).sum()).backward()
    optimizer.step()  # strict skips the first, and records the next pass (issue 52)
    optimizer.zero_grad()
    sqrt_nan(model(torch.ones(1, 3)).sum()).backward()
    with pytest.raises(autograd_guard.GuardError) as raised:
        optimizer.step()
    message = str(raised.value)
    assert "0.weight, 0.bias" in message and "SGD step" in message
    assert "made by SqrtBackward0" in message
    assert f"{__file__}:" in message and "Remedy:" in message


# -- issue 17, item 2: no AMP kernel for the device ---------------------------------------


def test_without_amps_kernel_the_check_still_works(monkeypatch):
    # torch 2.1 has no CPU kernel for _amp_foreach_non_finite_check_and_unscale_; the
    # fallback called the same kernel: strict raised on healthy steps.
    def no_kernel(*args, **kwargs):
        raise NotImplementedError("Could not run '_amp_foreach_non_finite_check_and_unscale_'")

    monkeypatch.setattr(torch, "_amp_foreach_non_finite_check_and_unscale_", no_kernel)

    def program() -> dict[str, object]:
        w = torch.nn.Parameter(torch.ones(3))
        big = torch.nn.Parameter(torch.full((4,), 0.1))  # a finite loss (1.2e38)
        optimizer = torch.optim.SGD([w, big], lr=1e-40)
        for _ in range(3):
            optimizer.zero_grad()
            (w.sum() + (big * 3e38).sum()).backward()  # gradients finite, their sum inf
            optimizer.step()
        return outcome([w, big], optimizer)

    bare, guarded, events = twin(program, {"mode": "strict"})
    assert_same(guarded, bare)
    assert events == []
    autograd_guard.install({"mode": "strict"})
    w = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([w], lr=0.1)
    sqrt_nan(w).backward()
    optimizer.step()  # strict skips the first non-finite step (issue 52)
    w.grad = None
    sqrt_nan(w).backward()
    with pytest.raises(autograd_guard.GuardError, match="non-finite gradient"):
        optimizer.step()
    assert torch.equal(w.detach(), torch.ones(3))
