"""A skipped step is a step not taken: in fix, a non-finite step equals the hand-written
``if not finite: zero_grad(); continue`` for any optimizer (weights, state, every
``param_groups`` key, attributes, inner optimizers), the check sees what the step would
see (after the user's pre-hooks), and closure steps say only what is true."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from grad_health_twin import assert_same, outcome, twin
from helpers import assert_attached

import autograd_guard
from autograd_guard.testing import capture_events


def sqrt_of_zero(w: torch.Tensor) -> torch.Tensor:
    return torch.sqrt((w * 0).pow(2).sum())  # finite forward, NaN gradient


def all_finite(params) -> bool:
    return all(bool(p.grad.isfinite().all()) for p in params if p.grad is not None)


class NoNoneChecks(torch.optim.Optimizer):
    """Research code: no ``p.grad is None`` check, a group counter and an attribute."""

    def __init__(self, params, lr=0.1):
        super().__init__(params, {"lr": lr})
        self.steps = 0

    @torch.no_grad()
    def step(self, closure=None):
        self.steps += 1
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            for p in group["params"]:
                p.add_(p.grad, alpha=-group["lr"])


class Wrapper(torch.optim.Optimizer):
    """A Lookahead-like wrapper: an inner optimizer and a counter of its own."""

    def __init__(self, inner):
        self.inner = inner
        super().__init__(inner.param_groups, {})
        self.slow_steps = 0

    def step(self, closure=None):
        self.inner.step()
        self.slow_steps += 1
        for group in self.param_groups:
            group["lookahead_step"] = group.get("lookahead_step", 0) + 1


class SubclassCallingSuper(torch.optim.Adam):
    """torch runs the hooks twice: this class's step wrapper, then Adam's."""

    def step(self, closure=None):
        self.calls = getattr(self, "calls", 0) + 1
        return super().step(closure)


def looped(make, by_hand: bool, pre_hook=None, bad_steps=(2, 3)):
    def program() -> dict[str, object]:
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(4))
        optimizer = make([w])
        if pre_hook is not None:
            optimizer.register_step_pre_hook(pre_hook)
        for step in range(6):
            optimizer.zero_grad()
            loss = (w - 1).pow(2).sum() + (sqrt_of_zero(w) if step in bad_steps else 0)
            loss.backward()
            if pre_hook is not None and by_hand:
                pre_hook(optimizer, (), {})
            if by_hand and not all_finite([w]):
                continue
            optimizer.step()
        attrs = {k: v for k, v in vars(optimizer).items() if isinstance(v, (int, float))}
        inner = getattr(optimizer, "inner", None)
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        return outcome(
            [w],
            optimizer,
            *([inner] if inner is not None else []),
            attrs=attrs,
            groups=copy.deepcopy(groups),
        )

    return program


OPTIMIZERS = {
    "no_none_checks": NoNoneChecks,
    "wrapper_with_inner_adam": lambda p: Wrapper(torch.optim.Adam(p, lr=0.1)),
    "subclass_calling_super": lambda p: SubclassCallingSuper(p, lr=0.1),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.1),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_skipped_step_is_the_hand_written_skip(name):
    make = OPTIMIZERS[name]
    by_hand = looped(make, True)()
    _, guarded, events = twin(looped(make, False))
    assert_same(guarded, by_hand)
    actions = [e["action"] for e in events if e["action"] != "nonfinite_origin"]
    assert actions == ["nonfinite_gradient"]  # one call site
    assert "skipped: its body did not run" in events[0]["event"]


def test_a_user_pre_hook_that_cleans_gradients_is_respected():
    calls = []

    def clean(optimizer, args, kwargs):
        calls.append(1)
        for group in optimizer.param_groups:
            for p in group["params"]:
                p.grad.nan_to_num_(0.0)

    looped(torch.optim.AdamW, False, pre_hook=clean, bad_steps=())()
    if not calls:  # torch's own bug, process-wide once anything was compiled
        pytest.skip("torch 2.1 after a torch.compile in this process runs no step hooks")

    make = OPTIMIZERS["adamw"]
    bare, guarded, events = twin(looped(make, False, pre_hook=clean))
    assert_same(guarded, bare)
    assert [e for e in events if e["action"] == "nonfinite_gradient"] == []


class SAM(torch.optim.Optimizer):
    """The widely copied two-phase SAM: perturb with the handed gradients, evaluate the
    closure there, restore and step the base optimizer."""

    def __init__(self, params, base, rho=0.05, **kwargs):
        super().__init__(params, {"rho": rho, **kwargs})
        self.base_optimizer = base(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def step(self, closure):
        norm = torch.norm(
            torch.stack([p.grad.norm(2) for g in self.param_groups for p in g["params"]]), 2
        )
        for group in self.param_groups:
            for p in group["params"]:
                e_w = p.grad * (group["rho"] / (norm + 1e-12))
                p.add_(e_w)
                self.state[p]["e_w"] = e_w
        with torch.enable_grad():
            closure()
        for group in self.param_groups:
            for p in group["params"]:
                p.sub_(self.state[p]["e_w"])
        self.base_optimizer.step()


def sam_program(by_hand: bool, bad_in_closure=(2,), bad_before=(4,)):
    def program() -> dict[str, object]:
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(4))
        optimizer = SAM([w], torch.optim.SGD, lr=0.1, momentum=0.9)
        for step in range(6):

            def closure(step=step):
                optimizer.zero_grad()
                bad = step in bad_in_closure
                loss = (w - 1).pow(2).sum() + (sqrt_of_zero(w) if bad else 0)
                loss.backward()
                return loss

            optimizer.zero_grad()
            loss = (w - 1).pow(2).sum() + (sqrt_of_zero(w) if step in bad_before else 0)
            loss.backward()
            if by_hand:
                if not all_finite([w]):
                    continue
                snapshot = copy.deepcopy((w.detach(), optimizer.state_dict()))
                if step in bad_in_closure:  # the closure would not be finite: skip whole
                    w.data.copy_(snapshot[0])
                    continue
            optimizer.step(closure)
        return outcome([w], optimizer, optimizer.base_optimizer)

    return program


def test_a_two_phase_closure_optimizer_is_undone_whole_and_says_so():
    by_hand = sam_program(True)()
    _, guarded, events = twin(sam_program(False))
    assert_same(guarded, by_hand)
    said = [e["event"] for e in events if e["action"] == "nonfinite_gradient"]
    assert len(said) == 1  # one call site: the first of the two bad steps
    assert "stopped at evaluation 1 of its closure and undone" in said[0]


def test_strict_on_a_two_phase_closure_optimizer_says_only_what_is_true():
    made: dict[str, object] = {}

    def program() -> dict[str, object]:
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(4))
        made["w"] = w
        optimizer = SAM([w], torch.optim.SGD, lr=0.1)
        before = w.detach().clone()
        (w - 1).pow(2).sum().backward()

        def closure():
            optimizer.zero_grad()
            loss = (w - 1).pow(2).sum() + sqrt_of_zero(w)
            loss.backward()
            return loss

        try:
            optimizer.step(closure)
        except autograd_guard.GuardError as error:
            return {"error": str(error), "same": torch.equal(w.detach(), before)}
        return {}

    _, guarded, _ = twin(program, {"mode": "strict"}, canary=False)
    assert guarded["same"] is True  # the first step had moved w; it was put back
    assert "the step was stopped and undone" in guarded["error"]


def test_vmap_of_grad_never_breaks_the_localiser():
    from torch.func import functional_call, grad, vmap

    autograd_guard.install({})
    try:
        assert_attached("grad_health", "torch.optim.optimizer")
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        params = {k: v.detach() for k, v in model.named_parameters()}

        def loss_fn(p, x):
            return sqrt_of_zero(functional_call(model, p, (x,)))

        with capture_events() as events:
            for _ in range(4):  # per-sample gradients, the localiser armed after the first
                per_sample = vmap(grad(loss_fn), in_dims=(None, 0))(params, torch.randn(4, 3))
                for name, p in model.named_parameters():
                    p.grad = per_sample[name].mean(0)
                optimizer.step()
    finally:
        autograd_guard.uninstall()
    assert [e["action"] for e in events] == ["nonfinite_gradient"]


# -- a hostile review's cases: the guard never goes quiet, and says only what is true ---


def nan_grads(model: torch.nn.Module, nan: bool) -> None:
    model.zero_grad()
    model(torch.randn(2, 3)).sum().backward()
    if nan:
        with torch.no_grad():
            model.weight.grad[0, 0] = float("nan")


@pytest.fixture
def guarded_fix():
    autograd_guard.install({})
    assert_attached("grad_health", "torch.optim.optimizer")
    try:
        yield
    finally:
        autograd_guard.uninstall()


def test_a_post_hook_that_raised_once_leaves_the_guard_on(guarded_fix):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []

    def post(*_):
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("once")

    optimizer.register_step_post_hook(post)
    nan_grads(model, False)
    with contextlib.suppress(ValueError):
        optimizer.step()
    if not calls:  # torch's own bug, process-wide once anything was compiled
        pytest.skip("torch 2.1 after a torch.compile in this process runs no step hooks")
    before = model.weight.detach().clone()
    nan_grads(model, True)
    optimizer.step()
    assert torch.equal(model.weight.detach(), before)  # skipped


def test_an_optimizer_stepped_from_another_ones_post_hook_is_checked(guarded_fix):
    first, second = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    a = torch.optim.SGD(first.parameters(), lr=0.1)
    b = torch.optim.SGD(second.parameters(), lr=0.1)
    a.register_step_post_hook(lambda *_: b.step())
    nan_grads(first, False)
    nan_grads(second, True)
    before = second.weight.detach().clone()
    a.step()
    assert torch.equal(second.weight.detach(), before)


def test_an_interrupted_check_never_silences_the_guard(guarded_fix, monkeypatch):
    from autograd_guard.guards.grad_health.check import FiniteCheck

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    original = FiniteCheck.all_finite
    interrupts = [1]

    def interrupted(self, *args, **kwargs):
        if interrupts:
            interrupts.pop()
            raise KeyboardInterrupt  # Ctrl-C inside the check
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FiniteCheck, "all_finite", interrupted)
    nan_grads(model, False)
    with pytest.raises(KeyboardInterrupt):
        optimizer.step()
    before = model.weight.detach().clone()
    nan_grads(model, True)
    optimizer.step()
    assert torch.equal(model.weight.detach(), before)  # still skipped


class Extragradient(torch.optim.Optimizer):
    """A closure step that moves the weights with an inner optimizer and counts, then
    evaluates the closure."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.1})
        self.inner = torch.optim.Adam(self.param_groups[0]["params"], lr=0.1)
        self.t = 0

    def step(self, closure):
        self.inner.step()
        self.t += 1
        closure()
        with torch.no_grad():
            for p in self.param_groups[0]["params"]:
                p.sub_(0.01 * p.grad)


def extragradient(by_hand: bool, swallow: bool = False):
    def program():
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(3))
        optimizer = Extragradient([w])
        for step in range(5):

            def closure(step=step):
                optimizer.zero_grad()
                ((w - 1).pow(2).sum() + (sqrt_of_zero(w) if step == 2 else 0)).backward()

            optimizer.zero_grad()
            (w - 1).pow(2).sum().backward()
            if by_hand and step == 2:
                continue
            optimizer.step(closure)
        return outcome([w], optimizer, optimizer.inner, t=optimizer.t)

    return program


def test_a_closure_step_is_undone_with_its_inner_optimizer_and_counters():
    by_hand = extragradient(True)()
    _, guarded, events = twin(extragradient(False))
    assert_same(guarded, by_hand)
    assert "stopped at evaluation 1 of its closure and undone" in events[0]["event"]


class Swallowing(Extragradient):
    def step(self, closure):
        self.t += 1
        with contextlib.suppress(BaseException):  # everything, the guard's stop included
            closure()
        with torch.no_grad():
            for p in self.param_groups[0]["params"]:
                p.sub_(0.01 * p.grad)


@pytest.mark.parametrize("mode", ["fix", "strict"])
def test_a_step_that_swallows_the_guards_stop_is_still_undone(mode):
    w = torch.nn.Parameter(torch.ones(3))
    optimizer = Swallowing([w])

    def closure():
        optimizer.zero_grad()
        sqrt_of_zero(w).backward()

    autograd_guard.install({"mode": mode})
    try:
        if mode == "strict":
            with pytest.raises(autograd_guard.GuardError, match="caught the guard's error"):
                optimizer.step(closure)
        else:
            optimizer.step(closure)
    finally:
        autograd_guard.uninstall()
    assert torch.equal(w.detach(), torch.ones(3)) and optimizer.t == 0


def test_a_step_replaced_on_its_class_is_gated_again(guarded_fix):
    class Mine(torch.optim.SGD):
        pass

    model = torch.nn.Linear(3, 2)
    nan_grads(model, False)
    Mine(model.parameters(), lr=0.1).step()

    def new_step(self, closure=None):
        with torch.no_grad():
            for p in self.param_groups[0]["params"]:
                p.add_(p.grad, alpha=-0.1)

    Mine.step = new_step
    optimizer = Mine(model.parameters(), lr=0.1)  # torch wraps the new step
    before = model.weight.detach().clone()
    nan_grads(model, True)
    optimizer.step()
    assert torch.equal(model.weight.detach(), before)


def test_a_class_is_walked_for_step_wrappers_once_until_its_step_changes(monkeypatch):
    """The gates remember each optimizer class by its ``step``: every optimizer step asks,
    and walking the MRO each time cost ~8 us a step; a replaced ``step`` is walked again."""
    from autograd_guard.guards.grad_health.gate import Gates

    walked: list[object] = []
    body_cell = Gates._body_cell

    def counted(self, step):
        walked.append(step)
        return body_cell(self, step)

    monkeypatch.setattr(Gates, "_body_cell", counted)

    class Custom(torch.optim.SGD):
        pass

    Custom([torch.nn.Parameter(torch.ones(1))], lr=0.1)  # torch wraps step on first use
    gates = Gates(lambda *a: None, lambda *a: None, lambda *a: None)
    try:
        gated = gates.ensure(Custom)  # which steps torch wraps differs by version
        once = len(walked)
        assert once >= 1 and gates.ensure(Custom) == gated and len(walked) == once
        monkeypatch.setattr(Custom, "step", lambda self, closure=None: None, raising=False)
        gates.ensure(Custom)
        assert len(walked) > once  # walked again
    finally:
        gates.remove()


def test_a_skipped_first_step_in_one_process_leaves_the_gradients(guarded_fix):
    """One process: a skip is a hand-written ``continue`` from the first step on (the lines
    after ``step()`` still read ``.grad``); nothing is dropped and no event says so."""
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    nan_grads(model, True)
    with capture_events() as events:
        optimizer.step()
    assert model.weight.grad is not None and model.bias.grad is not None
    assert not any("dropped" in str(e.get("event")) for e in events)
