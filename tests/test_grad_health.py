"""Guard grad_health on real torch training loops: lost gradients named by parameter,
non-finite gradients skipped (fix), raised (strict) or logged (observe), the backward op
and forward line they came from, and silence on correct loops."""

from __future__ import annotations

import json
import sys
import warnings

import pytest
import torch
from grad_health_twin import assert_guard_on
from helpers import assert_attached, run_python

import autograd_guard
from autograd_guard.testing import capture_events

ORIGINAL_BACKWARD = torch.autograd.backward
SKIP = {"guards": {"grad_health": {"nonfinite_fix": "skip"}}}  # every non-finite step skipped
OPTIM = "torch.optim.optimizer"  # the module grad_health hooks into


class Net(torch.nn.Module):
    def __init__(self, detach: bool = False) -> None:
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
        self.head = torch.nn.Linear(8, 1)
        self.aux = torch.nn.Linear(8, 1)
        self.detach = detach

    def forward(self, x: torch.Tensor, step: int = 0) -> torch.Tensor:
        features = self.backbone(x)
        if self.detach:
            features = features.detach()  # the backbone silently stops training
        out = self.head(features)
        if step % 2 == 0:
            out = out + self.aux(features)  # used every other step only
        return out


def train(net, steps=8, optimizer=None):
    torch.manual_seed(0)
    optimizer = optimizer or torch.optim.Adam(net.parameters(), lr=1e-2)
    for step in range(steps):
        optimizer.zero_grad()
        net(torch.randn(16, 4), step).pow(2).mean().backward()
        optimizer.step()  # STEP
    return optimizer


def step_line() -> str:
    import inspect

    lines, start = inspect.getsourcelines(train)
    return f"{__file__}:{start + next(i for i, s in enumerate(lines) if '# STEP' in s)}"


@pytest.mark.parametrize("mode", ["fix", "strict", "observe"])
def test_a_correct_loop_is_silent(mode):
    autograd_guard.install({"mode": mode})
    assert_attached("grad_health", OPTIM)
    with capture_events() as events:
        train(Net(), steps=12)  # the aux head gets a gradient every other step only
    assert events == []
    assert_guard_on()


def test_a_detached_backbone_is_named_once_with_the_step_line():
    autograd_guard.install({"guards": {"grad_health": {"lost_steps": 10}}})
    with capture_events() as events:
        train(Net(detach=True), steps=12)
    [event] = events
    assert event["action"] == "lost_gradient" and event["guard"] == "grad_health"
    assert event["parameters"] == ["backbone.0.weight", "backbone.0.bias"]
    assert event["callsite"] == step_line()


def nan_loop(steps=4):
    """sqrt of an exact zero: a finite forward (0) and a NaN backward."""
    w = torch.nn.Parameter(torch.full((3,), 2.0))
    optimizer = torch.optim.Adam([w], lr=0.1)
    for step in range(steps):
        optimizer.zero_grad()
        scale = 0.0 if step >= 1 else 1.0  # healthy first, then the bad input
        loss = torch.sqrt(((w - 1) * scale).pow(2).sum()) + w.sum()  # SQRT
        loss.backward()
        optimizer.step()
    return w, optimizer


def sqrt_line() -> str:
    import inspect

    lines, start = inspect.getsourcelines(nan_loop)
    return f"{__file__}:{start + next(i for i, s in enumerate(lines) if '# SQRT' in s)}"


def adam_state(optimizer, w):
    return {k: v.clone() for k, v in optimizer.state[w].items()}


def test_fix_skips_the_step_and_names_the_op_and_the_forward_line():
    w, optimizer = nan_loop(1)
    after_one, state = w.detach().clone(), adam_state(optimizer, w)
    autograd_guard.install(SKIP)
    with capture_events() as events:
        w, optimizer = nan_loop(4)
    assert torch.isfinite(w).all() and torch.equal(w.detach(), after_one)
    after = adam_state(optimizer, w)  # step count and both moments untouched
    assert after.keys() == state.keys() == {"step", "exp_avg", "exp_avg_sq"}
    assert all(torch.equal(after[k], state[k]) for k in state)
    assert w.grad is not None and not torch.isfinite(w.grad).all()  # the user's gradient
    first, origin = events
    assert first["action"] == "nonfinite_gradient" and "step was skipped" in first["event"]
    assert origin["action"] == "nonfinite_origin" and origin["op"] == "SqrtBackward0"
    assert origin["forward"] == sqrt_line()
    assert not torch.is_anomaly_enabled()  # the probe put everything back
    assert torch.autograd.backward is ORIGINAL_BACKWARD


def test_unguarded_the_nan_reaches_the_weights():
    w, _ = nan_loop(4)
    assert not torch.isfinite(w).all()


def test_observe_logs_and_changes_nothing():
    bare, bare_optimizer = nan_loop(4)
    autograd_guard.install({"mode": "observe"})
    with capture_events() as events:
        w, optimizer = nan_loop(4)
    same = dict(rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(w, bare, **same)
    torch.testing.assert_close(w.grad, bare.grad, **same)
    torch.testing.assert_close(adam_state(optimizer, w), adam_state(bare_optimizer, bare), **same)
    assert not torch.isfinite(w).all()
    assert [e["action"] for e in events][:1] == ["nonfinite_gradient"]


def test_strict_skips_names_the_op_then_raises_before_the_weights_change():
    """strict skips the first non-finite step, records the next backward pass, and the
    next step raises naming the op (issue 52): the weights never changed."""
    autograd_guard.install({"mode": "strict"})
    w = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([w], lr=0.1)
    with capture_events() as events:
        torch.sqrt((w * 0).pow(2).sum()).backward()
        optimizer.step()  # skipped, said at once
        assert [e["action"] for e in events] == ["nonfinite_gradient"]
        assert "the next step raises" in events[0]["event"] and events[0]["level"] == "error"
        optimizer.zero_grad()
        torch.sqrt((w * 0).pow(2).sum()).backward()  # recorded
        with pytest.raises(autograd_guard.GuardError, match="made by SqrtBackward0"):
            optimizer.step()
    assert torch.equal(w.detach(), torch.ones(3)) and not optimizer.state
    origin = [e for e in events if e["action"] == "nonfinite_origin"]
    assert len(origin) == 1 and origin[0]["op"] == "SqrtBackward0"
    assert not torch.is_anomaly_enabled() and torch.autograd.backward is ORIGINAL_BACKWARD


def test_strict_raises_at_the_next_step_of_another_optimizer_deciding_alone():
    """Two optimizers in one process (a GAN's halves), each past its first step: a
    non-finite step of ``first`` is skipped, the next pass recorded, and ``second``'s next
    step raises naming the op, before either's weights change again.
    (A step that ranks decide together runs instead: tests/test_grad_health_distributed's
    some_ranks_step.)"""
    autograd_guard.install({"mode": "strict"})
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    first, second = torch.optim.SGD([a], lr=0.1), torch.optim.SGD([b], lr=0.1)
    with capture_events():
        (a.sum() + b.sum()).backward()
        first.step()
        second.step()  # each has stepped once: each decides alone
        for optimizer in (first, second):
            optimizer.zero_grad()
        torch.sqrt((a * 0).pow(2).sum()).backward()
        first.step()  # skipped
        (torch.sqrt((a * 0).pow(2).sum()) + b.sum()).backward()  # recorded
        with pytest.raises(autograd_guard.GuardError, match="made by SqrtBackward0"):
            second.step()
    assert torch.equal(a.detach(), torch.full((3,), 0.9))  # its one finite step only
    assert torch.equal(b.detach(), torch.full((3,), 0.9))


def test_strict_with_one_loss_and_two_optimizers_names_the_op_after_the_next_pass():
    """One loss, two optimizers stepped back to back (an encoder's and a decoder's): no
    backward pass between them, so ``second``'s step is not where the op can be named. Its
    finite step runs; the next pass is recorded and the next step raises, naming it."""
    autograd_guard.install({"mode": "strict"})
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    first, second = torch.optim.SGD([a], lr=0.1), torch.optim.SGD([b], lr=0.1)
    with capture_events(), pytest.raises(autograd_guard.GuardError, match="made by Sqrt"):
        for _ in range(3):
            first.zero_grad()
            second.zero_grad()
            (torch.sqrt((a * 0).pow(2).sum()) + b.sum()).backward()
            first.step()  # skipped; then raises at the next iteration, named
            second.step()
    assert torch.equal(a.detach(), torch.ones(3)) and not first.state
    assert torch.allclose(b.detach(), torch.full((3,), 0.9))  # its one finite step


def test_uninstall_removes_every_patch():
    from torch.optim import optimizer as optim

    def hooks():
        return len(optim._global_optimizer_pre_hooks), len(optim._global_optimizer_post_hooks)

    patcher, before = optim.Optimizer.__dict__["_patch_step_function"], hooks()
    torch.optim.Adam([torch.nn.Parameter(torch.ones(1))])  # a class hooked before install
    autograd_guard.install({})
    # every class is gated (the one hooked before, at install; the others as they are
    # made): no step pays for a step hook
    assert hooks() == before
    assert optim.Optimizer.__dict__["_patch_step_function"] is not patcher
    with capture_events() as events:
        torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
        w, _ = nan_loop(3)
    assert torch.isfinite(w).all() and hooks() == before
    assert events[0]["action"] == "nonfinite_gradient"
    autograd_guard.uninstall()
    assert optim.Optimizer.__dict__["_patch_step_function"] is patcher and hooks() == before
    with capture_events() as events:
        w, _ = nan_loop(3)
    assert not torch.isfinite(w).all() and events == []


class Hidden(torch.optim.SGD):
    """A class whose step is torch's hooked one behind a callable that hides it (no
    ``__wrapped__``): it cannot be gated, only checked from torch's step hooks."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for param in group["params"]:
                param -= group["lr"] * param.grad


def test_a_class_that_cannot_be_gated_is_checked_from_the_step_hooks():
    from torch.optim import optimizer as optim

    w = torch.nn.Parameter(torch.ones(3))
    opt = Hidden([w], lr=0.1)  # torch wraps Hidden.step, before the guard is installed
    hooked = Hidden.__dict__["step"]

    def hidden(self, *args, **kwargs):
        return hooked(self, *args, **kwargs)

    hidden.hooked = True
    before = len(optim._global_optimizer_pre_hooks)
    try:
        Hidden.step = hidden
        autograd_guard.install({})
        assert len(optim._global_optimizer_pre_hooks) == before + 1  # for this class alone
        with capture_events() as events:
            torch.sqrt((w * 0).pow(2).sum()).backward()
            opt.step()
        [event] = [e for e in events if e["action"] == "nonfinite_gradient"]
        assert "Hidden.step is not torch's hooked step function" in event["event"]
        autograd_guard.uninstall()
        assert len(optim._global_optimizer_pre_hooks) == before
    finally:
        Hidden.step = hooked


DDP = """
import json, os, sys, torch
import torch.distributed as dist
import torch.multiprocessing as mp

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone, self.head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)

    def forward(self, x, zero):
        out = self.head(self.backbone(x).detach())  # the backbone never trains
        return out + torch.sqrt((out * zero).pow(2).sum())  # zero: NaN gradient

def worker(rank, log):
    os.environ.update(RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    import autograd_guard
    autograd_guard.install({"log": log, "guards": {"grad_health": {"lost_steps": 5}}})
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Net(), find_unused_parameters=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(8):
        optimizer.zero_grad()
        zero = 0.0 if step == 6 and rank == 1 else 1.0  # one rank's NaN, all-reduced
        model(torch.randn(8, 4), zero).pow(2).mean().backward()
        optimizer.step()
    weights = [p.detach().clone() for p in model.parameters()]
    gathered = [None, None]
    dist.all_gather_object(gathered, weights)
    assert all(torch.isfinite(w).all() for w in weights)
    assert all(torch.equal(a, b) for a, b in zip(*gathered))  # ranks in step
    dist.barrier()
    os._exit(0)  # leaves before gloo's teardown, which aborts on some runs

if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[2],), nprocs=2)
    print("done")
"""


def test_ddp_ranks_report_findings_each_and_a_step_decision_once(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    log = tmp_path / "events.jsonl"
    code = (
        f"import runpy, sys; sys.argv = ['ddp.py', '{port}', {str(log)!r}]; "
        "runpy.run_path('ddp.py', run_name='__main__')"
    )
    run_python(sys.executable, code, tmp_path, PYTHONPATH=":".join(sys.path))
    events = [json.loads(line) for line in log.read_text().splitlines()]
    by_action: dict[str, list[dict]] = {}
    for event in events:
        by_action.setdefault(event["action"], []).append(event)
    lost, nonfinite = by_action.pop("lost_gradient"), by_action.pop("nonfinite_gradient")
    assert by_action.keys() <= {"nonfinite_origin"}
    # a lost gradient is each rank's own finding; the step is one decision, logged by rank 0
    assert sorted(e["rank"] for e in lost) == [0, 1]
    assert [e["rank"] for e in nonfinite] == [0] and nonfinite[0]["ranks"] == [0, 1]
    assert all(e["parameters"] == ["backbone.weight", "backbone.bias"] for e in lost)
    assert nonfinite[0]["parameters"] == ["head.weight", "head.bias"]


def test_a_broken_check_leaves_the_step_as_it_is_unguarded(monkeypatch):
    from autograd_guard.guards.grad_health import check as _grad_check

    def broken(self, *args):
        raise KeyError("broken")

    monkeypatch.setattr(_grad_check.FiniteCheck, "all_finite", broken)
    autograd_guard.install({})
    w = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([w], lr=0.5)
    with capture_events() as events:
        w.sum().backward()
        optimizer.step()
    assert torch.equal(w.detach(), torch.full((3,), 0.5))  # the step ran as unguarded
    [event] = events
    assert event["action"] == "guard_error" and "KeyError" in event["error"]


def test_a_step_with_a_closure_is_checked_after_the_closure_ran():
    # The gradients of a closure step exist only inside step(); checked before it, the
    # NaN would reach the weights and be seen one step late.
    w = torch.nn.Parameter(torch.full((3,), 2.0))
    optimizer = torch.optim.Adam([w], lr=0.1)

    def closure(scale):
        optimizer.zero_grad()
        loss = torch.sqrt(((w - 1) * scale).pow(2).sum()) + w.sum()
        loss.backward()
        return loss

    optimizer.step(lambda: closure(1.0))
    before, state = w.detach().clone(), adam_state(optimizer, w)
    autograd_guard.install({})
    with capture_events() as events:
        optimizer.step(lambda: closure(0.0))  # positional
        optimizer.step(closure=lambda: closure(0.0))  # by keyword
    assert torch.equal(w.detach(), before)
    assert all(torch.equal(adam_state(optimizer, w)[k], state[k]) for k in state)
    assert [e["action"] for e in events][:1] == ["nonfinite_gradient"]
    assert events[0]["parameters"] == ["<unnamed (3,)>"]  # a bare tensor has no module


def test_localising_counts_backward_passes_not_steps():
    # The step that finds the NaN has already run its backward: a single recorded pass
    # must still be the next one.
    autograd_guard.install({"guards": {"grad_health": {"localize_steps": 1}}})
    with capture_events() as events:
        nan_loop(3)
    assert [e.get("op") for e in events] == [None, "SqrtBackward0"]


class Norm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x).pow(2).sum(1).pow(0.5)  # POW: d/dx at an exact zero is inf


def norm_run(mode: str, fix: str = "skip") -> list[dict]:
    net = Norm()
    torch.nn.init.zeros_(net.lin.weight)
    torch.nn.init.zeros_(net.lin.bias)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    autograd_guard.install({"mode": mode, "guards": {"grad_health": {"nonfinite_fix": fix}}})
    with capture_events() as events:
        for _ in range(6):
            optimizer.zero_grad()
            net(torch.ones(2, 3)).sum().backward()
            optimizer.step()
    return [e for e in events if not _of_loss(e)]  # observe: the NaN weights' NaN losses


def _of_loss(event: dict) -> bool:
    return event["action"] == "nonfinite_loss" or event.get("of") == "loss"


def test_the_op_and_line_inside_a_module_are_named_once_in_fix():
    import inspect

    first, origin = norm_run("fix")  # six bad steps: each event once
    assert first["parameters"] == ["lin.weight", "lin.bias"]
    lines, start = inspect.getsourcelines(Norm)
    line = start + next(i for i, s in enumerate(lines) if "# POW" in s)
    assert origin["op"] == "PowBackward0" and origin["forward"] == f"{__file__}:{line}"
    assert not torch.is_anomaly_enabled() and torch.autograd.backward is ORIGINAL_BACKWARD


def test_observe_never_blames_an_op_of_a_forward_that_was_already_not_finite():
    # observe let the first NaN step through: the next forward runs on NaN weights, and
    # the first op whose backward is not finite (the loss's) did not make the value
    first, origin = norm_run("observe")
    assert first["parameters"] == ["lin.weight", "lin.bias"]
    assert "nonfinite_origin event follows" in first["remedy"]
    assert "op" not in origin and "could not be found" in origin["event"]
    assert "already non-finite when they entered the forward pass" in origin["event"]
    assert "observe let steps with non-finite gradients through" in origin["event"]
    assert "AUTOGRAD_GUARD=fix" in origin["remedy"] and "detect_anomaly" in origin["remedy"]
    assert not torch.is_anomaly_enabled() and torch.autograd.backward is ORIGINAL_BACKWARD


@pytest.mark.skipif(
    not hasattr(torch.amp, "GradScaler"), reason="no GradScaler for the CPU in this torch"
)
def test_gradscaler_steps_are_left_to_gradscaler():
    # A scaled loss overflows on purpose now and then; GradScaler skips those steps itself
    # (fused Adam gets the scaled gradients and the inf flag): no event.
    for fused in (False, True):
        autograd_guard.install({"mode": "strict"})
        assert_attached("grad_health", OPTIM)
        w = torch.nn.Parameter(torch.ones(3))
        optimizer = torch.optim.Adam([w], lr=0.1, fused=fused)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
        with capture_events() as events:
            for step in range(4):
                optimizer.zero_grad()
                scaler.scale((w * (1e35 if step == 1 else 1.0)).sum()).backward()
                scaler.step(optimizer)
                scaler.update()
        assert events == [] and float(optimizer.state[w]["step"]) == 3
        assert_guard_on()
        autograd_guard.uninstall()


def test_dtypes_large_finite_values_and_sparse_gradients_are_silent():
    autograd_guard.install({"mode": "strict"})
    assert_attached("grad_health", OPTIM)
    params = [
        torch.nn.Parameter(torch.ones(4, dtype=dtype))
        for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    ]
    embedding = torch.nn.Embedding(10, 3, sparse=True)
    dense, sparse = (
        torch.optim.SGD(params, lr=1e-40),
        torch.optim.SparseAdam(list(embedding.parameters())),
    )
    with capture_events() as events:
        for _ in range(6):
            loss = sum((p.float() * 1e30).sum() for p in params[:2])  # a huge, finite grad
            (loss + sum(p.float().sum() for p in params[2:])).backward()
            embedding(torch.tensor([1, 2])).sum().backward()
            dense.step()
            sparse.step()
    assert events == []
    assert_guard_on()


def test_a_nan_in_a_sparse_gradient_is_found():
    autograd_guard.install({"mode": "strict"})
    embedding = torch.nn.Embedding(10, 3, sparse=True)
    optimizer = torch.optim.SparseAdam(list(embedding.parameters()))
    before = embedding.weight.detach().clone()
    with capture_events() as events:
        (embedding(torch.tensor([1, 2])) * float("nan")).sum().backward()
        optimizer.step()  # strict skips the first, and says so (issue 52)
        assert events[-1]["parameters"] == ["weight"] and events[-1]["level"] == "error"
        (embedding(torch.tensor([1, 2])) * float("nan")).sum().backward()
        with pytest.raises(autograd_guard.GuardError, match="non-finite gradient in weight"):
            optimizer.step()
    assert torch.equal(embedding.weight.detach(), before)


def test_the_localiser_reads_a_sparse_gradient_without_failing():
    """fix skips a sparse NaN step, and the localiser that follows mends the sparse
    gradient of EmbeddingBackward0 through its stored values: no guard_error, and the
    origin event says what is true (a one-off value), with no warning of torch's."""
    autograd_guard.install({})
    embedding = torch.nn.Embedding(10, 3, sparse=True)
    optimizer = torch.optim.SGD(embedding.parameters(), lr=0.1)
    with capture_events() as events, warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(6):
            optimizer.zero_grad()
            out = embedding(torch.tensor([1, 2, 2, 5])).sum()
            (out * float("nan") if step == 1 else out).backward()
            optimizer.step()
    assert [e["action"] for e in events if _of_loss(e)] == ["nonfinite_loss", "nonfinite_origin"]
    assert "a one-off value" in events[-1]["event"]  # the next forward pass made none
    events = [e for e in events if not _of_loss(e)]
    assert [e["action"] for e in events] == ["nonfinite_gradient", "nonfinite_origin"]
    assert "a one-off value" in events[1]["event"]
    assert torch.isfinite(embedding.weight).all()


def test_observe_names_the_parameters_once_per_call_site(monkeypatch):
    from autograd_guard.guards.grad_health import nonfinite

    scans = []
    monkeypatch.setattr(nonfinite, "parameter_names", lambda ps: scans.append(ps) or ["w"])
    autograd_guard.install({"mode": "observe", "guards": {"grad_health": {"lost_steps": 0}}})
    nan_loop(6)  # five NaN steps at one call site: one scan of the live objects
    assert len(scans) == 1


GUARDED_NAN_LOOP = """
import torch
w = torch.nn.Parameter(torch.full((3,), 2.0))
optimizer = torch.optim.Adam([w], lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    torch.sqrt((w * 0).pow(2).sum()).backward()
    optimizer.step()
print("finite", bool(torch.isfinite(w).all()))
"""


def test_on_by_default_when_the_guard_is_on(guard_python, tmp_path):
    unguarded = run_python(guard_python, GUARDED_NAN_LOOP, tmp_path)
    assert "finite False" in unguarded.stdout
    guarded = run_python(guard_python, GUARDED_NAN_LOOP, tmp_path, AUTOGRAD_GUARD="1")
    assert "finite True" in guarded.stdout
    assert "[grad_health/nonfinite_gradient]" in guarded.stderr
    assert "<string>:8" in guarded.stderr  # the optimizer.step() line


# -- a shared step that one rank leaves without the guard's word (grad_health.skips) ------


class _Channel:
    closed = None


class _Sharing:
    channel = _Channel()


class _Stage:
    def __init__(self) -> None:
        self.cleared = 0

    def clear_runtime_states(self) -> None:
        self.cleared += 1


class _Post:
    def __init__(self) -> None:
        self.steps: list[int] = []

    def __call__(self, optimizer: object, record: object, step: int) -> None:
        self.steps.append(step)


def test_the_skip_watch_posts_at_a_forward_after_a_backward_with_no_word_between():
    # grad_health.skips on a model's top module: a forward that finds a backward begun
    # since the last word posts once, for the step left; a forward under no_grad, or
    # without a backward before it, posts nothing; a closed channel takes the hooks away
    from autograd_guard.guards.grad_health import skips
    from autograd_guard.guards.grad_health.record import Record

    inner = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh(), torch.nn.Linear(2, 1))
    model = torch.nn.ModuleDict({"body": inner})  # its top module, never called
    top = torch.nn.Sequential(inner)
    optimizer = torch.optim.SGD(inner.parameters(), lr=0.1)
    assert {id(m) for m in skips.top_modules(list(inner.parameters()))} == {id(model), id(top)}
    record, post = Record(), _Post()
    record.sharing = _Sharing()  # type: ignore[assignment]
    skips.watch(optimizer, record, list(inner.parameters()), post, lambda f: f)
    x = torch.ones(3, 2)
    top(x).sum().backward()
    record.step = 1
    skips.spoke(record)  # step 1's exchange
    top(x).sum().backward()
    with torch.no_grad():
        top(x)
    assert post.steps == []  # a step skipped, not yet a forward with autograd
    top(x)  # no backward of this one
    assert post.steps == [2]  # the step left: the next one
    top(x)
    assert post.steps == [2]
    top(x).sum().backward()
    record.step = 3  # a step counted, its check failed open before the exchange
    top(x)
    assert post.steps == [2, 3]
    top(x).sum().backward()
    record.depth = 1  # a forward inside the optimizer's own step (a closure) posts nothing
    top(x)
    record.depth = 0
    assert post.steps == [2, 3]
    top(x).sum().backward()
    stage = _Stage()  # a pipeline stage: the schedule's step clears it before it receives
    record.skips.hook_stage(stage)
    stage.clear_runtime_states()
    assert post.steps == [2, 3, 4] and stage.cleared == 1
    top(x).sum().backward()
    record.sharing = None  # the channel closed
    top(x)
    assert post.steps == [2, 3, 4] and record.skips.handles == []
    skips.remove(record)
    assert record.skips is None and not top._forward_pre_hooks and not top._forward_hooks
    assert "clear_runtime_states" not in vars(stage)


def step_hooks_run() -> bool:
    """Whether torch's own SGD runs its step pre-hooks here (unguarded)."""
    ran: list[int] = []
    probe = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    probe.register_step_pre_hook(lambda *_: ran.append(1))
    probe.step()
    return bool(ran)


def test_an_optimizers_first_step_pre_hook_comes_first_and_goes_at_its_first_gate():
    # the guard's first-step pre-hook (finding whether the optimizer is shared before a
    # user's pre-hook can raise) runs before the user's, stays while the step never
    # reached the gate, and is gone after; observe sets none
    if not step_hooks_run():
        pytest.skip(
            "this torch runs no step hook in this process: 2.1's dynamo, once "
            "loaded, takes the hook runner off torch's optimizers"
        )
    autograd_guard.install({"mode": "fix"})
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    order: list[str] = []

    def user_hook(*_: object) -> None:
        order.append("user")
        if len(order) == 1:
            raise RuntimeError("out of memory")

    optimizer.register_step_pre_hook(user_hook)
    hooks = optimizer._optimizer_step_pre_hooks
    assert len(hooks) == 2 and next(iter(hooks.values())) is not user_hook
    model(torch.ones(1, 2)).sum().backward()
    with pytest.raises(RuntimeError, match="out of memory"):
        optimizer.step()
    assert len(hooks) == 2  # the step never reached the gate
    optimizer.step()
    assert list(hooks.values()) == [user_hook] and order == ["user", "user"]
    never = torch.optim.SGD(model.parameters(), lr=0.1)
    assert len(never._optimizer_step_pre_hooks) == 1
    autograd_guard.uninstall()  # an optimizer that never stepped loses it too
    assert len(never._optimizer_step_pre_hooks) == 0
    autograd_guard.install({"mode": "observe"})
    assert len(torch.optim.SGD(model.parameters(), lr=0.1)._optimizer_step_pre_hooks) == 0


def test_the_channel_decides_no_more_once_its_process_group_is_destroyed():
    # a rank that goes on alone after destroy_process_group() never waits in the exchange
    from datetime import timedelta

    import torch.distributed as dist

    from autograd_guard.guards.grad_health.channel import ChannelClosed, channel_for

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group in this process")
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30)
    )
    try:
        channel = channel_for(dist, [0], 30.0)
        assert channel.all_reduce(torch.ones(1, dtype=torch.float64)).item() == 1.0
    finally:
        dist.destroy_process_group()
    with pytest.raises(ChannelClosed):
        channel.all_reduce(torch.ones(1, dtype=torch.float64))
    assert channel.closed is not None and channel.said  # nothing said: the user parted them


def test_an_inner_optimizers_first_step_pre_hook_leaves_the_step_to_the_outer_one():
    # an optimizer stepping another inside its own step (ZeRO, Lookahead): the inner one's
    # first-step pre-hook finds nothing out (its outer step speaks for the step), so no
    # hooks of its own watch the model
    import gc

    from autograd_guard.guards.grad_health import GradHealth

    class Outer(torch.optim.Optimizer):
        def __init__(self, params: list[torch.nn.Parameter]) -> None:
            super().__init__(params, {"lr": 0.1})
            self.inner = torch.optim.SGD(params, lr=0.1)

        def step(self, closure: object = None) -> None:
            self.inner.step()

    autograd_guard.install({"mode": "fix"})
    model = torch.nn.Linear(2, 1)
    outer = Outer(list(model.parameters()))
    model(torch.ones(1, 2)).sum().backward()
    outer.step()
    (guard,) = [g for g in gc.get_objects() if type(g) is GradHealth and g.active]
    assert guard._records.find(outer).shared_known == 2
    assert guard._records.find(outer.inner).shared_known == -1
