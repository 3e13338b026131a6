"""grad_health's zero_gradient finding: every gradient exactly zero for ``zero_steps``
optimizer steps in a row, told apart from missing gradients (lost_gradient), non-finite
ones and steps without gradients."""

from __future__ import annotations

import sys

import pytest
import torch

import autograd_guard
from autograd_guard._common import STATE
from autograd_guard.testing import capture_events


def loop(steps: int, scale=lambda step: 0.0, optimizer=torch.optim.Adam, mode="fix", **policy):
    """Two parameters whose loss is scaled by ``scale(step)``: 0.0 gives a graph whose
    every gradient is exactly zero."""
    autograd_guard.install({"mode": mode, "guards": {"grad_health": policy}})
    w, b = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(2))
    opt = optimizer([w, b], lr=0.1)
    with capture_events() as events:
        for step in range(steps):
            opt.zero_grad()
            ((w * scale(step)).sum() + (b * scale(step)).sum()).backward()
            opt.step()
    return [e for e in events if e["action"] != "summary"]


def test_all_zero_gradients_are_said_once_the_streak_is_reached_and_not_before(monkeypatch):
    monkeypatch.delitem(sys.modules, "pytorch3d.renderer", raising=False)  # a plain program
    assert loop(19) == []
    [event] = loop(20)
    assert event["action"] == "zero_gradient" and event["level"] == "warning"
    assert event["steps"] == 20 and event["optimizer"] == "Adam"
    assert "exactly zero for 20 optimizer steps in a row" in event["event"]
    assert "detached" in event["remedy"] and "hard threshold" in event["remedy"]
    # PyTorch3D's silhouettes are no lead in a program that does not render with it
    assert "PyTorch3D" not in event["remedy"] and "blur_radius" not in event["remedy"]
    assert event["callsite"].startswith(__file__)


def test_pytorch3d_s_hard_silhouettes_are_named_where_its_renderer_is_imported(monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "pytorch3d.renderer", types.ModuleType("pytorch3d.renderer"))
    [event] = loop(20)
    assert "SoftSilhouetteShader with blur_radius=0" in event["remedy"]


def test_one_event_per_streak_and_a_new_streak_after_a_gradient():
    assert [e["steps"] for e in loop(60)] == [20]
    autograd_guard.uninstall()
    STATE.reset()
    [event] = loop(50, scale=lambda step: 1.0 if step == 25 else 0.0)
    # steps 0-19, then 26-45: the second streak at this call site is counted, not logged
    assert STATE.counts[("grad_health", "zero_gradient", event["callsite"])] == 2


@pytest.mark.parametrize("start", [20, 30, 37, 43])
def test_a_streak_that_begins_later_is_named_at_its_last_step(start):
    """A streak of exactly zero_steps steps that begins after the first zero_steps (20)
    is named at its 20th step, and a run one step shorter names nothing: every step is
    read (a probe on one step in a few would miss the streaks shorter than 20 + its
    stride)."""
    for steps, named in ((start + 19, False), (start + 20, True)):
        autograd_guard.uninstall()
        STATE.reset()
        events = loop(steps, scale=lambda step: 1.0 if step < start else 0.0)
        assert [e["action"] for e in events] == (["zero_gradient"] if named else []), steps


def test_one_nonzero_step_breaks_a_streak():
    # zero everywhere but one step in each 7: never 20 zero steps in a row
    assert loop(120, scale=lambda step: 1.0 if step % 7 == 3 else 0.0) == []


@pytest.mark.parametrize("scale", [1e-30, -1e-38])
def test_tiny_gradients_are_not_zero(scale):
    events = loop(40, scale=lambda step: scale)
    # -1e-38 is subnormal: where denormals-are-zero is on for this thread (a library built
    # with -ffast-math turns it on as it loads, such as a torch.compile'd CPU kernel of an
    # older torch, earlier in the same process), it reads as zero, to the optimizer too
    zero_here = not bool((torch.tensor([scale]) != 0).all())
    assert [e["action"] for e in events] == (["zero_gradient"] if zero_here else [])


def test_one_parameter_with_a_gradient_is_enough():
    autograd_guard.install({})
    frozen, live = torch.nn.Parameter(torch.ones(100)), torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([frozen, live], lr=0.1)
    with capture_events() as events:
        for step in range(40):
            opt.zero_grad()
            # which one carries the gradient changes: the probed one is found again
            ((frozen * (step % 3 == 0)).sum() + (live * (step % 3 != 0)).sum()).backward()
            opt.step()
    assert events == []


def test_a_relu_network_whose_units_are_all_dead():
    autograd_guard.install({})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU())
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # every pre-activation negative
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    with capture_events() as events:
        for _ in range(20):
            opt.zero_grad()
            model(torch.rand(16, 3)).sum().backward()
            opt.step()
    assert [e["action"] for e in events] == ["zero_gradient"]


def test_steps_without_gradients_and_non_finite_steps_are_not_zero_steps():
    def scale(step: int) -> float:
        return float("nan") if step % 10 == 9 else 0.0  # every tenth step is not finite

    actions = {e["action"] for e in loop(40, scale=scale)}
    # no zero_gradient (the NaN steps' loss is NaN too: said, issue 52)
    assert actions == {"nonfinite_gradient", "nonfinite_loss", "nonfinite_origin"}
    autograd_guard.install({})
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    with capture_events() as events:
        for _ in range(30):
            opt.zero_grad()  # no backward: no gradient at all
            opt.step()
    assert events == []


def test_a_step_without_gradients_breaks_a_streak():
    """The event says every gradient was zero for N steps in a row, none missing: a step
    between them that had no gradient at all (no backward) ends the streak."""
    autograd_guard.install({"guards": {"grad_health": {"zero_steps": 4, "lost_steps": 0}}})
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([w], lr=0.1)
    with capture_events() as events:
        for step in range(6):  # zero, zero, none, zero, zero, zero: no streak of 4
            opt.zero_grad()
            if step != 2:
                (w * 0.0).sum().backward()
            opt.step()
    assert [e["action"] for e in events if e["action"] != "summary"] == []
    with capture_events() as events:
        for _ in range(1):  # one more zero step: a streak of 4
            opt.zero_grad()
            (w * 0.0).sum().backward()
            opt.step()
    assert [e["action"] for e in events] == ["zero_gradient"]


def test_the_probe_goes_back_to_the_smallest_gradient(monkeypatch):
    """A one-value gradient that was exactly 0 at one step (a bias at an exact fit) moves
    the probe to a larger gradient, a kernel per step; after ``AGAIN`` steps the one-value
    gradient is probed again, read with no kernel."""
    from autograd_guard.guards.grad_health.zero import AGAIN

    autograd_guard.install({})
    w, b = torch.nn.Parameter(torch.ones(256)), torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w, b], lr=0.0)
    kernels = []
    count_nonzero = torch.count_nonzero
    monkeypatch.setattr(torch, "count_nonzero", lambda *a: kernels.append(1) or count_nonzero(*a))

    def step(bias_scale: float) -> int:
        kernels.clear()
        opt.zero_grad()
        (w.sum() + b.sum() * bias_scale).backward()
        opt.step()
        return len(kernels)

    assert [step(1.0) for _ in range(3)] == [0, 0, 0]  # b's one value, read on the host
    assert step(0.0) == 2  # b's gradient is 0: every gradient is read, w is not 0
    assert [step(1.0) for _ in range(AGAIN - 1)] == [1] * (AGAIN - 1)  # w is probed
    assert [step(1.0) for _ in range(3)] == [0, 0, 0]  # b again


def test_an_optimizer_whose_gradients_have_no_elements_has_no_zero_steps():
    """A gradient of zero elements holds no value that could be zero: vacuous."""
    autograd_guard.install({})
    empty = torch.nn.Parameter(torch.empty(0))
    opt = torch.optim.SGD([empty], lr=0.1)
    with capture_events() as events:
        for _ in range(40):
            opt.zero_grad()
            empty.sum().backward()
            assert empty.grad is not None and empty.grad.numel() == 0
            opt.step()
    assert events == []


def test_a_gradient_without_elements_is_never_probed(monkeypatch):
    """Beside a gradient with elements, an empty one is neither the probe (which would
    read zero and make every healthy step read every gradient) nor read with the rest."""
    counted: list[int] = []
    count_nonzero = torch.count_nonzero

    def counting(values):
        counted.append(values.numel())
        return count_nonzero(values)

    monkeypatch.setattr(torch, "count_nonzero", counting)
    autograd_guard.install({})
    empty, live = torch.nn.Parameter(torch.empty(0, 5)), torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([empty, live], lr=0.1)
    with capture_events() as events:
        for step in range(25):
            opt.zero_grad()
            (empty.sum() + (live * float(step < 5)).sum()).backward()
            opt.step()
    assert [e["action"] for e in events] == ["zero_gradient"]  # steps 5-24
    # the probe (live) each step, and live again in each zero step's full read: never empty
    assert counted == [3] * (5 + 20 * 2)


def sparse_gradient(size: tuple[int, int], indices: list[int], values: list[float]):
    return torch.sparse_coo_tensor(
        torch.tensor([indices, [0] * len(indices)], dtype=torch.long).reshape(2, -1),
        torch.tensor(values),
        size=size,
        check_invariants=True,
    )


@pytest.mark.parametrize(
    ("indices", "values", "expected"),
    [([], [], True), ([3, 7], [0.0, 0.0], True), ([3, 7], [0.0, -2.0], False)],
)
def test_a_sparse_gradient_is_read_by_its_stored_values_never_densified(indices, values, expected):
    """A dense copy of this gradient would need 2**51 values: only its stored ones are
    counted. One with no stored values (an empty index batch) is zero."""
    from autograd_guard.guards.grad_health import zero
    from autograd_guard.guards.grad_health.record import Record

    grads, record = [sparse_gradient((2**31, 2**20), indices, values)], Record()
    flag = zero.probe(record, grads)
    assert flag is not None and zero.all_zero(record, grads, flag) is expected


@pytest.mark.parametrize(("batch", "found"), [(0, True), (4, False)])
def test_sparse_adam_on_an_embedding(batch, found):
    """nn.Embedding(sparse=True) fed empty index batches: a sparse gradient with no
    values, genuinely zero, every step; a real batch is not."""
    autograd_guard.install({})
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(1000, 8, sparse=True)
    opt = torch.optim.SparseAdam(embedding.parameters(), lr=0.01)
    with capture_events() as events:
        for _ in range(20):
            opt.zero_grad()
            embedding(torch.randint(0, 1000, (batch,))).pow(2).sum().backward()
            assert embedding.weight.grad.is_sparse
            opt.step()
    assert [e["action"] for e in events] == (["zero_gradient"] if found else [])


def test_lbfgs_at_its_exact_optimum_is_named_as_a_reading_of_the_event():
    """LBFGS reaches the minimum of a quadratic exactly (gradient 0.0): the words do not
    claim the loss cannot go down; they name a converged loss beside a cut gradient."""
    autograd_guard.install({})
    w = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.LBFGS([w])

    def closure():
        opt.zero_grad()
        loss = ((w - 2.0) ** 2).sum()
        loss.backward()
        return loss

    with capture_events() as events:
        for _ in range(22):
            opt.step(closure)
    assert torch.equal(w.detach(), torch.full((3,), 2.0))
    [event] = events
    assert event["action"] == "zero_gradient" and event["optimizer"] == "LBFGS"
    assert "exact stationary point (a converged" in event["event"]
    assert "cuts the gradient" in event["event"] and "cannot go down" not in event["event"]
    assert "converged exactly" in event["remedy"] and "hinge" in event["remedy"]


def test_zero_steps_sets_the_streak_and_zero_turns_it_off():
    assert [e["steps"] for e in loop(12, zero_steps=5)] == [5]
    assert loop(40, zero_steps=0) == []


@pytest.mark.parametrize("mode", ["observe", "strict"])
def test_every_mode_warns_and_lets_the_steps_run(mode):
    autograd_guard.install({"mode": mode, "guards": {"grad_health": {"zero_steps": 3}}})
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1, weight_decay=0.5)
    with capture_events() as events:
        for _ in range(4):
            opt.zero_grad()
            (w * 0).sum().backward()
            opt.step()
    assert torch.allclose(w.detach(), torch.full((2,), 0.95**4))  # weight decay moved it
    assert [(e["action"], e["level"]) for e in events] == [("zero_gradient", "warning")]


def test_a_closure_step_counts_once_however_many_evaluations():
    autograd_guard.install({"guards": {"grad_health": {"zero_steps": 4}}})
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (w * 0).sum()
        loss.backward()
        return loss

    with capture_events() as events:
        for _ in range(3):
            opt.step(closure)
    assert events == []
    with capture_events() as events:
        opt.step(closure)
    assert [e["steps"] for e in events] == [4]


def fused_adam(params, lr):
    return torch.optim.Adam(params, lr=lr, fused=True)


def fused_cpu_supported() -> bool:
    try:
        fused_adam([torch.nn.Parameter(torch.ones(1))], 0.1)
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize(
    ("mode", "optimizer"),
    [
        ("observe", torch.optim.Adam),
        pytest.param(
            "fix",
            fused_adam,
            marks=pytest.mark.skipif(not fused_cpu_supported(), reason="no fused Adam on CPU"),
        ),
    ],
)
def test_a_flag_left_on_the_device_carries_the_probe(monkeypatch, mode, optimizer):
    """The CUDA path on the CPU: the flag is lent (fix, fused) or read later (observe),
    the probe with it; a probe that read zero makes the next steps read every gradient."""
    from autograd_guard.guards.grad_health import check as _grad_check

    monkeypatch.setattr(_grad_check, "DEFERRED_DEVICE_TYPES", {"cpu", "cuda"})
    [event] = loop(30, optimizer=optimizer, mode=mode, zero_steps=5)
    assert event["action"] == "zero_gradient" and event["steps"] == 5
    assert loop(30, scale=lambda step: 1e-30, optimizer=optimizer, mode=mode) == []
    events = loop(30, scale=lambda step: float(step % 4 == 0), optimizer=optimizer, mode=mode)
    assert events == []  # three zero steps at most, then a gradient


def deferred_said(monkeypatch, losses, steps=6, optimizer=torch.optim.Adam, late=False):
    """The CUDA path on the CPU (observe, zero_steps=3): each step's flag and probe are left
    on the device and read once ready; ``late``: never in their own step (a GPU still busy
    at its post-hook). ``losses(w, b, step)`` is each step's loss. The steps where a
    streak is said."""
    from autograd_guard.guards.grad_health import check as _grad_check

    monkeypatch.setattr(_grad_check, "DEFERRED_DEVICE_TYPES", {"cpu", "cuda"})
    asked: dict[int, object] = {}  # holds each flag: no later one can take its id

    def ready(pending) -> bool:  # not ready when first asked: read a step late
        first = id(pending) not in asked
        asked[id(pending)] = pending
        return not first

    if late:
        monkeypatch.setattr(_grad_check.PendingFlag, "ready", ready)
    autograd_guard.install({"mode": "observe", "guards": {"grad_health": {"zero_steps": 3}}})
    w, b = torch.nn.Parameter(torch.ones(8)), torch.nn.Parameter(torch.zeros(1))
    opt = optimizer([w, b], lr=0.01)
    said, seen = [], 0
    with capture_events() as events:  # each streak's call site counts as new again
        for step in range(steps):
            losses(w, b, step).backward()
            opt.step()
            opt.zero_grad()
            said += [step for e in events[seen:] if e["action"] == "zero_gradient"]
            seen = len(events)
    return said


def deferred_streaks(monkeypatch, pattern: str, late: bool = False) -> list[int]:
    """``deferred_said`` of ``pattern``: R a gradient (w's alone), Z an all-zero step."""

    def losses(w, b, step):
        return (w * float(pattern[step] == "R")).sum()

    return deferred_said(monkeypatch, losses, len(pattern), late=late)


def test_a_flag_read_in_its_own_step_counts_that_step(monkeypatch):
    """Read at the step's end (the gradients are still the step's): each step counts where
    it happened, so a streak is said at its third step, and one of exactly three is said."""
    assert deferred_streaks(monkeypatch, "ZZZZ") == [2]
    assert deferred_streaks(monkeypatch, "RZZZR") == [3]
    assert deferred_streaks(monkeypatch, "RZZRZZR") == []


def test_a_flag_read_late_counts_the_streak_from_the_first_step_read_at_once(monkeypatch):
    """Read late (a GPU still busy at the step's end; here, at the next step's end): that
    step's gradients are gone by then, so the steps are counted from the first one read
    at once, the step after the late read. Said two steps late, never early: what it says
    of the steps it counted stays true."""
    from autograd_guard.guards.grad_health.check import FiniteCheck

    if not FiniteCheck().slot(torch.device("cpu")).kernel:  # no flag left on the device
        pytest.skip(f"torch {torch.__version__} has no fused non-finite check on the CPU")
    assert deferred_streaks(monkeypatch, "ZZZZ", late=True) == []
    assert deferred_streaks(monkeypatch, "ZZZZZ", late=True) == [4]
    assert deferred_streaks(monkeypatch, "RZZZZR", late=True) == []
    assert deferred_streaks(monkeypatch, "RZZZZZR", late=True) == [5]


class HandWrittenSGD(torch.optim.Optimizer):
    """A user's SGD with no ``super().step()`` (whose own end, where a parent class's step
    is hooked too, would come before the gradients change); ``after`` what it does to
    each gradient once used: zero it in place, or free it."""

    after = "zero"

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])
                    if self.after == "zero":
                        p.grad.zero_()
                    else:
                        p.grad = None


class ZeroingSGD(HandWrittenSGD):
    """Zeroes its gradients in place in its own step."""


class FreeingSGD(HandWrittenSGD):
    """Frees its gradients in its own step."""

    after = "free"


def test_a_step_whose_optimizer_changes_its_gradients_is_not_counted_at_its_end(monkeypatch):
    """An optimizer that zeroes (or frees) the gradients in its step: what is read at the
    step's end is not what the step consumed. Step 0's w gradient was not zero (only the
    probed b's was): it must not count. The next step is then read before it runs, so
    the streak of steps 1-5 is said at its third step, step 3, as on the eager path."""

    def r_then_zero(w, b, step):
        return (w * w).sum() * float(step == 0) + 0.0 * b.sum()

    assert deferred_said(monkeypatch, r_then_zero, optimizer=ZeroingSGD) == [3]
    autograd_guard.uninstall()
    assert deferred_said(monkeypatch, r_then_zero, optimizer=FreeingSGD) == [3]


def test_a_closure_step_counts_by_its_first_evaluation_on_the_deferred_path(monkeypatch):
    """LBFGS solving a hinge exactly in step 0: its first evaluation's gradient was 1.0,
    its last one's 0. Step 0 is not a zero step; steps 1-3 are, said at step 3."""
    from autograd_guard.guards.grad_health import check as _grad_check

    monkeypatch.setattr(_grad_check, "DEFERRED_DEVICE_TYPES", {"cpu", "cuda"})
    autograd_guard.install({"mode": "observe", "guards": {"grad_health": {"zero_steps": 3}}})
    w = torch.nn.Parameter(torch.tensor([2.0]))
    opt = torch.optim.LBFGS([w], lr=1.0, max_iter=5)

    def closure():
        opt.zero_grad()
        loss = torch.relu(w - 1).sum()  # a hinge: gradient 1 above 1, exactly 0 at or below
        loss.backward()
        return loss

    said = []
    with capture_events() as events:
        for step in range(5):
            opt.step(closure)
            said += [step for e in events if e["action"] == "zero_gradient"]
            events.clear()
    assert said == [3]


def test_on_cuda_the_probe_is_read_with_the_finite_flag(monkeypatch):
    """One read for both: the fused check on a CUDA slot (its device faked) fills in the
    probe's answer, so that no second read is made."""
    from autograd_guard.guards.grad_health.check import FiniteCheck, Probe

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    check, grads = FiniteCheck(), [torch.zeros(3), torch.ones(2)]
    slot = check.slot(grads[0].device)
    if not slot.kernel:
        pytest.skip(f"torch {torch.__version__} has no fused non-finite check on the CPU")
    slot.cuda = True
    zero, live = Probe(grads[0]), Probe(grads[1])
    assert check.all_finite(grads, slot, zero) and zero.nonzero is False
    assert check.all_finite(grads, slot, live) and live.nonzero is True
    grads[1][0] = float("inf")
    assert not check.all_finite(grads, slot, Probe(grads[1]))
    assert check.all_finite(grads[:1], slot)  # the flag was cleared after the read


GROUP = """
import os, sys, torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer

class Net(torch.nn.Module):
    def __init__(self, live):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.live = live  # ddp: every gradient zero; zero: b's is not

    def forward(self, x):
        return self.a(x).sum() * 0 + self.b(x).sum() * self.live  # a's gradient is zero

def worker(rank, port, log, kind):
    os.environ.update(RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    import autograd_guard
    autograd_guard.install({"log": log, "guards": {"grad_health": {"zero_steps": 3}}})
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Net(float(kind == "zero")))
    if kind == "zero":  # one parameter per rank: only one rank's shard is all zero
        optimizer = ZeroRedundancyOptimizer(
            [model.module.a.weight, model.module.b.weight], torch.optim.SGD, lr=0.1
        )
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).backward()
        optimizer.step()
    dist.barrier()
    os._exit(0)  # leaves before gloo's teardown, which aborts on some runs

if __name__ == "__main__":
    mp.spawn(worker, args=tuple(sys.argv[1:4]), nprocs=2)
"""


def group_run(tmp_path, kind: str) -> list[dict]:
    import json
    import socket
    import sys

    from helpers import run_python

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "group.py").write_text(GROUP)
    log = tmp_path / f"{kind}.jsonl"
    code = (
        f"import runpy, sys; sys.argv = ['group.py', '{port}', {str(log)!r}, {kind!r}]; "
        "runpy.run_path('group.py', run_name='__main__')"
    )
    run_python(sys.executable, code, tmp_path, PYTHONPATH=":".join(sys.path))
    lines = log.read_text().splitlines() if log.exists() else []
    return [e for e in map(json.loads, lines) if e["action"] == "zero_gradient"]


def test_ddp_ranks_decide_together_and_the_first_logs(tmp_path):
    [event] = group_run(tmp_path, "ddp")
    assert event["rank"] == 0 and event["ranks"] == [0, 1] and event["steps"] == 3


def test_a_zero_shard_on_one_rank_is_not_the_group_s_finding(tmp_path):
    """ZeRO: rank 1 consumes only a's gradient (zero), rank 0 only b's (not): the words
    ride the step's all-reduce, so neither rank says every gradient was zero."""
    assert group_run(tmp_path, "zero") == []


def fit_with(extra, steps=30, mode="observe", **policy):
    """A head that trains beside ``extra(model, x)`` (a loss term of the model's ``side``
    layer and its ``gate``, a scalar that starts at 0); the events of ``steps`` steps."""
    torch.manual_seed(0)
    head = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 1))
    model = torch.nn.ModuleDict({"head": head, "side": torch.nn.Linear(4, 4)})
    model.gate = torch.nn.Parameter(torch.zeros(()))
    autograd_guard.install({"mode": mode, "guards": {"grad_health": policy}})
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with capture_events() as events:
        for _ in range(steps):
            optimizer.zero_grad()
            x = torch.randn(8, 4)
            (head(x).pow(2).mean() + extra(model, x)).backward()
            optimizer.step()
    return [e for e in events if e["action"] != "summary"]


@pytest.mark.parametrize("mode", ["observe", "fix", "strict"])
def test_a_parameter_whose_gradient_is_zero_at_every_step_while_the_others_train(mode):
    # a mask of zeros in front of the side layer: its weight and bias never train
    [event] = fit_with(lambda model, x: (model["side"](x) * torch.zeros(4)).sum(), mode=mode)
    assert event["action"] == "zero_gradient_parameter" and event["level"] == "warning"
    assert event["parameters"] == ["side.weight", "side.bias"] and event["steps"] == 20
    assert "exactly zero at every one of this Adam's first 20 steps" in event["event"]
    assert event["callsite"].startswith(__file__)


def test_tiny_gradients_before_a_normalisation_and_a_zero_initialised_gate_are_not_zero():
    # every parameter of the head trains (the Linear before LayerNorm too): silent
    assert fit_with(lambda model, x: 0 * x.sum()) == []

    def gated(model, x):  # ReZero: the branch gets a gradient once the gate has moved
        return (model.gate * model["side"](x)).pow(2).mean() + (model.gate - 1) ** 2

    assert fit_with(gated) == []


def test_every_gradient_zero_is_the_streak_s_finding_not_this_one_and_zero_steps_0_is_off():
    assert [e["action"] for e in loop(20)] == ["zero_gradient"]
    assert fit_with(lambda model, x: (model["side"](x) * 0).sum(), zero_steps=0) == []
