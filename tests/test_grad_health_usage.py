"""grad_health's parameters without a gradient, told apart by what the forward pass did:
a step with no gradient at all (``zero_grad()`` between ``backward()`` and ``step()``, no
``backward()``, a detached loss) is a finding; a parameter whose module ran and got no
gradient is *lost* (a finding); one whose module never ran is *unused* (a note, never a
failure); what cannot be known (outside any module, gradients set by hand) is never a strict
failure. Each a twin run where the program's outcome matters, and the forward watch's cost:
none on a healthy step."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import thirdparty
import torch
from grad_health_twin import assert_same, outcome, twin
from helpers import run_python

import autograd_guard
from autograd_guard.testing import capture_events

HOOKS = torch.nn.modules.module._global_forward_pre_hooks


class Net(torch.nn.Module):
    """A backbone and a head; ``spare`` is defined and never called in forward."""

    def __init__(self, cut: str = "") -> None:
        super().__init__()
        self.backbone, self.head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)
        self.spare = torch.nn.Linear(8, 8)
        self.cut = cut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cut == "no_grad":
            with torch.no_grad():
                features = self.backbone(x)
        else:
            features = self.backbone(x)
        if self.cut == "detach":
            features = features.detach()
        if self.cut == "numpy":
            features = torch.from_numpy(features.detach().numpy())
        return self.head(features)


def train(
    model: torch.nn.Module, steps: int, bug: str = "", seen: Callable[[int], None] | None = None
) -> None:
    """A loop with one of the newcomer's bugs that leave every gradient None; ``seen`` is
    called after each step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        if bug != "zero_grad_late":
            optimizer.zero_grad()
        loss = model(torch.randn(4, 4)).pow(2).mean()
        if bug == "detached_loss":
            loss = loss.detach().requires_grad_()
        if bug != "no_backward":
            loss.backward()
        if bug == "zero_grad_late":
            optimizer.zero_grad()  # between backward() and step(): every .grad is None
        optimizer.step()
        if seen is not None:
            seen(step)


def run(
    model: torch.nn.Module, steps: int, bug: str = "", **policy: object
) -> list[dict[str, object]]:
    autograd_guard.install({"guards": {"grad_health": policy}} if policy else {})
    try:
        with capture_events() as events:
            train(model, steps, bug)
    finally:
        autograd_guard.uninstall()
    return events


# -- a step with no gradients -------------------------------------------------------------


@pytest.mark.parametrize("bug", ["zero_grad_late", "no_backward", "detached_loss"])
def test_a_loop_where_no_gradient_ever_arrives_is_named_at_the_lost_steps_step(bug):
    steps: list[int] = []
    autograd_guard.install({"guards": {"grad_health": {"lost_steps": 10}}})
    try:
        with capture_events() as events:
            train(Net(), 15, bug, lambda _: steps.append(len(events)))
    finally:
        autograd_guard.uninstall()
    [event] = events
    assert event["action"] == "no_gradient" and event["level"] == "warning"
    assert steps.index(1) == 9  # logged at the 10th step, not later
    assert "in 10 steps in a row while its modules ran in the forward pass" in event["event"]
    assert "zero_grad() between backward() and step()" in event["event"]
    assert "zero_grad() before loss.backward()" in event["remedy"]


def test_strict_raises_at_the_step_where_no_gradient_reaches_lost_steps():
    autograd_guard.install({"mode": "strict", "guards": {"grad_health": {"lost_steps": 10}}})
    seen: list[int] = []
    try:
        with pytest.raises(autograd_guard.GuardError, match="nothing trains"):
            train(Net(), 15, "zero_grad_late", seen.append)
    finally:
        autograd_guard.uninstall()
    assert seen == list(range(9))  # the 10th step raised


def test_no_gradient_leaves_the_program_as_it_is_in_fix():
    def program() -> dict[str, object]:
        model = Net()
        train(model, 120, "zero_grad_late")
        return outcome(model.parameters())

    bare, guarded, events = twin(program)
    assert_same(guarded, bare)
    assert [e["action"] for e in events] == ["no_gradient"]


def test_frozen_parameters_and_optimizers_never_stepped_stay_silent():
    def program() -> dict[str, object]:
        frozen = torch.nn.Linear(4, 4).requires_grad_(False)
        optimizer = torch.optim.SGD(frozen.parameters(), lr=0.1)
        never = torch.optim.SGD(torch.nn.Linear(4, 4).parameters(), lr=0.1)
        for _ in range(150):
            frozen(torch.randn(2, 4)).sum()
            optimizer.step()
        return outcome(frozen.parameters(), optimizer, never)

    bare, guarded, events = twin(program, {"mode": "strict"})
    assert_same(guarded, bare)
    assert events == []


def test_gradscaler_skipped_steps_stay_silent():
    scaler_kind = getattr(torch.amp, "GradScaler", None)
    try:
        scaler = scaler_kind("cpu", init_scale=2.0**16) if scaler_kind else None
    except (TypeError, RuntimeError):
        scaler = None
    if scaler is None or not scaler.is_enabled():
        pytest.skip("no GradScaler for the CPU in this torch")

    def program() -> dict[str, object]:
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(120):  # every loss is inf: GradScaler skips every step
            optimizer.zero_grad()
            scaler.scale(model(torch.randn(2, 4)).sum() * float("inf")).backward()
            scaler.step(optimizer)
            scaler.update(2.0**16)
        return outcome(model.parameters(), optimizer)

    bare, guarded, events = twin(program, {"mode": "strict"})
    assert_same(guarded, bare)
    assert events == []


# -- lost or unused -------------------------------------------------------------------------


def test_a_layer_never_called_is_a_note_never_a_failure():
    def program() -> dict[str, object]:
        model = Net()
        train(model, 150)
        return outcome(model.parameters())

    bare, guarded, events = twin(program, {"mode": "strict"})
    assert_same(guarded, bare)
    [note] = events
    assert note["action"] == "unused_parameter" and note["level"] == "info"
    assert note["parameters"] == ["spare.weight", "spare.bias"]
    assert "defined but never called in forward?" in note["event"]


@pytest.mark.parametrize("cut", ["detach", "no_grad", "numpy"])
def test_a_module_that_ran_and_got_no_gradient_is_lost(cut):
    events = run(Net(cut), 12, lost_steps=10)
    lost, unused = (
        next(e for e in events if e["action"] == action)
        for action in ("lost_gradient", "unused_parameter")
    )
    assert lost["parameters"] == ["backbone.weight", "backbone.bias"]
    assert "though their modules ran in the forward pass" in lost["event"]
    assert unused["parameters"] == ["spare.weight", "spare.bias"]
    autograd_guard.install({"mode": "strict", "guards": {"grad_health": {"lost_steps": 10}}})
    try:
        with pytest.raises(autograd_guard.GuardError, match=r"backbone\.weight"):
            train(Net(cut), 12)
    finally:
        autograd_guard.uninstall()


def test_a_data_write_in_the_modules_own_forward_is_lost():
    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(4))
            self.head = torch.nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(x * self.scale.data)  # .data: out of the graph

    [event] = run(Scale(), 6, lost_steps=5)
    assert event["action"] == "lost_gradient" and event["parameters"] == ["scale"]


def test_a_parameter_outside_any_module_is_a_warning_never_a_strict_failure():
    def program() -> dict[str, object]:
        model = torch.nn.Linear(4, 1)
        loose = torch.nn.Parameter(torch.ones(3))
        optimizer = torch.optim.SGD([*model.parameters(), loose], lr=0.1)
        for _ in range(120):
            optimizer.zero_grad()
            (model(torch.randn(2, 4)).sum() + loose.detach().sum()).backward()
            optimizer.step()
        return outcome([*model.parameters(), loose], optimizer)

    bare, guarded, events = twin(program, {"mode": "strict"})
    assert_same(guarded, bare)
    [event] = events
    assert event["action"] == "lost_gradient" and event["level"] == "warning"
    assert "belongs to no module" in event["event"] and "never a strict failure" in event["event"]


def test_gradients_set_by_hand_with_no_forward_pass_never_fail_strict():
    # pytorch_optimizer's tests: parameters of a model, gradients written by hand, some None
    def program() -> dict[str, object]:
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
        for _ in range(120):
            model[0].weight.grad = torch.ones_like(model[0].weight)
            optimizer.step()
        return outcome(model.parameters(), optimizer)

    bare, guarded, events = twin(program, {"mode": "strict"})
    assert_same(guarded, bare)
    [note] = events
    assert note["action"] == "unused_parameter"
    assert "gradients set by hand?" in note["event"]
    assert note["parameters"] == ["0.bias", "1.weight", "1.bias"]


# -- cost ---------------------------------------------------------------------------------


def test_a_healthy_loop_never_watches_the_forward_pass():
    autograd_guard.install({})
    try:
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            before = dict(HOOKS)
            optimizer.step()
            assert dict(HOOKS) == before
    finally:
        autograd_guard.uninstall()


def test_the_watch_is_on_for_one_step_only():
    autograd_guard.install({})
    watched: list[int] = []
    try:
        train(Net(), 5, seen=lambda _: watched.append(len(HOOKS)))
    finally:
        autograd_guard.uninstall()
    assert watched == [1, 0, 0, 0, 0]


# -- in a child interpreter: the exit status --------------------------------------------

SHORT = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
spare = torch.nn.Linear(3, 3)  # defined, never called
optimizer = torch.optim.SGD([*model.parameters(), *spare.parameters()], lr=0.01)
for step in range(20):
    optimizer.zero_grad()
    loss = model(torch.randn(4, 4)).pow(2).mean()
    loss.backward()
    {late}
    optimizer.step()
print("done")
"""


@pytest.mark.parametrize(("late", "status"), [("optimizer.zero_grad()", 3), ("pass", 0)])
def test_strict_fails_a_short_run_without_gradients_at_exit(guard_python, tmp_path, late, status):
    result = run_python(guard_python, SHORT.format(late=late), tmp_path, check=False,
                        AUTOGRAD_GUARD="strict")  # fmt: skip
    assert "done" in result.stdout
    assert result.returncode == status, result.stderr
    if status:
        assert "no_gradient" in result.stderr and "in 20 steps in a row" in result.stderr
    else:
        assert "unused_parameter" in result.stderr


def test_pytorch_optimizer_swats_with_gradients_by_hand_passes_under_strict(monkeypatch):
    monkeypatch.syspath_prepend(str(thirdparty.install("pytorch_optimizer")))
    from pytorch_optimizer import SWATS

    def program() -> dict[str, object]:
        active, other = (torch.nn.Parameter(torch.randn(1, 2)) for _ in range(2))
        optimizer = SWATS([active, other], lr=1e-1, nesterov=True, eps=1.0)
        for _ in range(3):  # the upstream test: one step without gradients, then by hand
            optimizer.step()
            active.grad = torch.ones_like(active)
        return outcome([active, other], optimizer)

    bare, guarded, events = twin(program, {"mode": "strict"})
    assert_same(guarded, bare)
    assert events == []


def test_lightning_eval_mode_warning_with_a_layer_never_called_passes_under_strict(
    monkeypatch, tmp_path
):
    # Lightning 2.6.5's test_eval_mode_warning: a layer attached to BoringModel and never
    # called, 64 steps of one epoch; its run ended with a lost_gradient, status 3 in strict.
    monkeypatch.syspath_prepend(str(thirdparty.install("lightning")))
    from lightning.pytorch import Trainer
    from lightning.pytorch.demos.boring_classes import BoringModel

    def program() -> dict[str, object]:
        model = BoringModel()
        model.some_eval_module = torch.nn.Linear(32, 16)
        model.some_eval_module.eval()
        trainer = Trainer(
            default_root_dir=tmp_path, max_epochs=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(model)
        return outcome(model.parameters())

    bare, guarded, events = twin(
        program, {"mode": "strict", "guards": {"grad_health": {"lost_steps": 50}}}
    )
    assert_same(guarded, bare)
    [note] = events
    assert note["action"] == "unused_parameter"
    assert note["parameters"] == ["some_eval_module.weight", "some_eval_module.bias"]


LIGHTNING_EVAL_MODE = """
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

model = BoringModel()
model.some_eval_module = torch.nn.Linear(32, 16)  # attached, never called
model.some_eval_module.eval()
Trainer(default_root_dir=".", max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False).fit(model)
print("fitted")
"""


def test_lightnings_eval_mode_test_ends_with_status_0_under_strict(guard_python, tmp_path):
    # 64 steps, shorter than lost_steps: the layer was a lost_gradient at exit, status 3
    folder = thirdparty.install("lightning")
    result = run_python(guard_python, LIGHTNING_EVAL_MODE, tmp_path, check=False,
                        AUTOGRAD_GUARD="strict", PYTHONPATH=str(folder))  # fmt: skip
    assert "fitted" in result.stdout
    assert result.returncode == 0, result.stderr
    assert "unused_parameter" in result.stderr and "lost_gradient" not in result.stderr
    assert "Exception ignored" not in result.stderr  # a finalizer imported at shutdown


def test_steps_meant_to_have_no_gradient_stay_silent_in_strict(monkeypatch):
    # Lightning: a training_step that returns None makes its closure return None, and the
    # step runs without backward; Lightning's own tests also mock Tensor.backward.
    from unittest import mock

    def program() -> dict[str, object]:
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def closure() -> None:
            optimizer.zero_grad()
            model(torch.randn(2, 4)).sum()  # no loss returned, no backward

        for _ in range(120):
            optimizer.step(closure)
        with mock.patch("torch.Tensor.backward"):
            train(model, 120)
        return outcome(model.parameters(), optimizer)

    bare, guarded, events = twin(program, {"mode": "strict"})
    assert_same(guarded, bare)
    assert events == []


GONE = """
import torch

def fit():
    layer = torch.nn.Linear(3, 1)
    radius = torch.full((1, 60), 0.05, requires_grad=True)  # outside any module
    optimizer = torch.optim.Adam([*layer.parameters(), radius], lr=0.01)
    for step in range(4):
        optimizer.zero_grad()
        (layer(torch.ones(60, 3)).squeeze(1) * radius.detach()).sum().backward()
        optimizer.step()

fit()  # the optimizer is gone before exit
print("done")
"""


@pytest.mark.parametrize(("mode", "status"), [("fix", 0), ("strict", 0)])
def test_a_parameter_outside_any_module_of_an_optimizer_gone_is_named_at_exit(
    guard_python, tmp_path, mode, status
):
    result = run_python(guard_python, GONE, tmp_path, check=False, AUTOGRAD_GUARD=mode)
    assert "done" in result.stdout and result.returncode == status, result.stderr
    assert "[grad_health/lost_gradient] 1 parameter(s) of a Adam gone before exit" in result.stderr
    assert "<a parameter of shape (1, 60)>" in result.stderr


# -- in a child interpreter: whatever is freed when, nothing at shutdown ------------------

FREED = """
import torch

def make():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    spare = torch.nn.Linear(3, 3)  # defined, never called
    optimizer = torch.optim.SGD([*model.parameters(), *spare.parameters()], lr=0.01)
    return model, spare, optimizer

def fit(model, optimizer):
    for step in range(20):
        optimizer.zero_grad()
        model(torch.randn(4, 4)).pow(2).mean().backward()
        optimizer.step()

{program}
print("done")
"""
ORDERS = {
    # module-level globals, alive until the interpreter shuts down
    "alive at exit": "model, spare, optimizer = make()\nfit(model, optimizer)",
    # a test function's end: the model's locals go before the optimizer's
    "freed in a function": (
        "def run():\n    model, spare, optimizer = make()\n    fit(model, optimizer)\n\nrun()"
    ),
    "optimizer freed first": (
        "model, spare, optimizer = make()\nfit(model, optimizer)\ndel optimizer\ndel model, spare"
    ),
    "model freed first": (
        "model, spare, optimizer = make()\nfit(model, optimizer)\ndel model, spare\ndel optimizer"
    ),
}


@pytest.fixture(scope="module")
def unguarded_status(guard_python, tmp_path_factory) -> dict[str, int]:
    """Each program's exit status without the guard."""
    cwd = tmp_path_factory.mktemp("unguarded")
    statuses = {}
    for order, program in ORDERS.items():
        result = run_python(guard_python, FREED.format(program=program), cwd, check=False,
                            AUTOGRAD_GUARD="off")  # fmt: skip
        assert "done" in result.stdout and result.stderr == "", result.stderr
        statuses[order] = result.returncode
    return statuses


@pytest.mark.parametrize("mode", ["observe", "fix", "strict"])
@pytest.mark.parametrize("order", list(ORDERS))
def test_a_layer_never_called_stays_a_note_and_shutdown_prints_nothing(
    guard_python, tmp_path, unguarded_status, order, mode
):
    # the shape of Lightning's test_eval_mode_warning: at exit a finalizer imported
    # ("Exception ignored in ... Records._dropper.<locals>.drop ... sys.meta_path is
    # None"), and an optimizer freed after its model named the layer a lost_gradient
    program = FREED.format(program=ORDERS[order])
    result = run_python(guard_python, program, tmp_path, check=False, AUTOGRAD_GUARD=mode)
    assert "done" in result.stdout
    assert result.returncode == unguarded_status[order], result.stderr
    assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr
    assert "lost_gradient" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    [at] = [i for i, line in enumerate(lines) if "unused_parameter" in line]
    note = lines[at]
    assert "2 parameter(s)" in note and "never ran in the forward pass" in note
    # the names follow on the event's indented lines (a terminal's second layer)
    details = [note, *itertools.takewhile(lambda line: line.startswith(" "), lines[at + 1 :])]
    assert any("weight, bias" in line for line in details), result.stderr


class OdeFunc(torch.nn.Module):
    """An adjoint ODE solver's function: constants that require grad kept as a plain
    attribute and in a list, handed to the optimizer, used in every forward evaluation;
    the solver hands gradients to registered parameters only (here: ``.detach()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.k = torch.tensor(0.5, requires_grad=True)
        self.extra = [torch.ones(2, requires_grad=True)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.k.detach() + self.extra[0].detach()


def ode_fit(steps: int) -> tuple[OdeFunc, torch.optim.Optimizer]:
    torch.manual_seed(0)
    func = OdeFunc()
    optimizer = torch.optim.Adam([*func.parameters(), func.k, *func.extra], lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        func(torch.randn(4, 2)).pow(2).mean().backward()
        optimizer.step()
    return func, optimizer


def test_tensors_kept_as_module_attributes_are_named_where_they_live_and_lost():
    """Tensors that require grad stored as attributes of a module that ran (issue 49) are
    named by their attribute path and judged lost (their module ran), not "<unnamed>" of
    no module; strict fails on them."""
    policy = {"mode": "strict", "guards": {"grad_health": {"lost_steps": 3}}}
    autograd_guard.install(policy)
    with capture_events() as events, pytest.raises(autograd_guard.GuardError, match=r"k, extra\.0"):
        ode_fit(6)
    [lost] = [e for e in events if e["action"] == "lost_gradient"]
    assert lost["parameters"] == ["k", "extra.0"] and lost["level"] == "error"
    assert "though their modules ran in the forward pass" in lost["event"]


ODE_GONE = """
import torch

class OdeFunc(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.k = torch.tensor(0.5, requires_grad=True)
        self.extra = [torch.ones(2, requires_grad=True)]

    def forward(self, x):
        return self.lin(x) * self.k.detach() + self.extra[0].detach()

def fit():
    func = OdeFunc()
    optimizer = torch.optim.Adam([*func.parameters(), func.k, *func.extra], lr=0.01)
    for _ in range(6):
        optimizer.zero_grad()
        func(torch.randn(4, 2)).pow(2).mean().backward()
        optimizer.step()

fit()  # the optimizer and its model are freed before exit
print("done")
"""


def test_module_attribute_tensors_of_an_optimizer_gone_before_exit_keep_their_names(
    guard_python, tmp_path
):
    """The same, for a run shorter than ``lost_steps`` whose optimizer is freed before exit:
    said at exit with the names kept while the modules lived (never "<a parameter of
    shape ()>", "never watched"), and strict ends with status 3."""
    result = run_python(guard_python, ODE_GONE, tmp_path, check=False, AUTOGRAD_GUARD="strict")
    assert "done" in result.stdout and result.returncode == 3, result.stderr
    assert "though their modules ran in the forward pass: k, extra.0" in result.stderr
    assert "<a parameter of shape" not in result.stderr


class Decayed(torch.nn.Module):
    """A regulariser's list of other modules' parameters (``decayed``) and an LSTM (whose
    ``_flat_weights`` list holds its own parameters again); ``aux_head`` never runs."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.aux_head = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
        self.lstm = torch.nn.LSTM(3, 3)
        self.decayed = [self.body.weight, self.aux_head.weight]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(self.body(x).unsqueeze(1))[0].squeeze(1)


def test_parameters_listed_by_another_module_keep_their_names_and_judgement():
    """Attribute tensors are a module's own plain tensors only: a list of another module's
    parameters does not make a layer that never ran "lost" (strict runs on), and an LSTM's
    weights keep their names (not ``lstm._flat_weights.0``)."""
    from autograd_guard.guards.grad_health.check import parameter_names

    torch.manual_seed(0)
    model = Decayed()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    autograd_guard.install({"mode": "strict", "guards": {"grad_health": {"lost_steps": 3}}})
    with capture_events() as events:
        for _ in range(5):
            optimizer.zero_grad()
            model(torch.randn(4, 3)).pow(2).mean().backward()
            optimizer.step()
    assert [e["action"] for e in events] == ["unused_parameter"]
    assert events[0]["parameters"] == ["aux_head.weight", "aux_head.bias"]
    names = parameter_names(list(model.lstm.parameters()))
    assert names == [f"lstm.{n}" for n, _ in model.lstm.named_parameters()]


def test_uninstall_closes_a_forward_watch_left_open():
    """A watch open at uninstall (a parameter still waiting for its first gradient) takes
    its global forward pre-hook with it."""
    before = len(HOOKS)
    autograd_guard.install({})
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    optimizer.zero_grad()
    model(torch.randn(4, 4)).pow(2).mean().backward()
    optimizer.step()
    assert len(HOOKS) == before + 1  # spare waits for its first gradient: a watch is on
    autograd_guard.uninstall()
    assert len(HOOKS) == before
