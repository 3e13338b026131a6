"""grad_health under torch.compile: started by the real ``.pth`` in a child interpreter
(where ``torch.optim.optimizer`` is imported while ``import torch`` still runs), after
torch 2.1's first compile (which strips the optimizer-hook wrapper), and the CUDA path that
lends a fused optimizer the flag (no host sync) run through its CPU twin."""

from __future__ import annotations

import re

import pytest
import torch
from grad_health_twin import assert_same, hook_log, outcome, twin
from helpers import run_python

import autograd_guard
from autograd_guard.testing import capture_events

COMPILED_LOOP = """
import sys, torch
net = torch.nn.Linear(3, 3)
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)

@torch.compile(backend="eager")
def train_step(x, scale):
    optimizer.zero_grad()
    out = net(x).pow(2).sum(1)
    torch.sqrt(out * scale).sum().backward()  # scale 0: sqrt of an exact zero
    optimizer.step()

for _ in range(4):
    train_step(torch.ones(2, 3), torch.tensor(1.0))
print("HEALTHY STEPS DONE", file=sys.stderr, flush=True)
for _ in range(3):
    train_step(torch.ones(2, 3), torch.tensor(0.0))
print("finite", all(bool(torch.isfinite(p).all()) for p in net.parameters()))
"""


def lines_of(stderr: str) -> set[str]:
    """stderr lines without torch's log prefix (time, pid) and Dynamo's frame numbers."""
    prefix = re.compile(r"^[WIE]\d{4} [\d:.]+ \d+ |\[\d+/\d+\] ")
    return {prefix.sub("", line) for line in stderr.splitlines()}


def test_through_the_pth_a_compiled_train_step_is_checked_and_healthy_steps_are_silent(
    guard_python, tmp_path
):
    # Registered while `import torch` ran, the hooks were traced by Dynamo: the NaN step
    # went through and healthy steps printed pages of graph-break warnings.
    bare = run_python(guard_python, COMPILED_LOOP, tmp_path)
    guarded = run_python(guard_python, COMPILED_LOOP, tmp_path, AUTOGRAD_GUARD="1")
    assert "finite False" in bare.stdout
    assert "finite True" in guarded.stdout  # the NaN steps were skipped
    healthy, _, nan_steps = guarded.stderr.partition("HEALTHY STEPS DONE")
    assert "[grad_health/nonfinite_gradient]" in nan_steps  # the guard is on
    assert lines_of(healthy) <= lines_of(bare.stderr.partition("HEALTHY STEPS DONE")[0])


def test_the_check_keeps_working_after_a_compile_strips_the_step_hooks():
    # torch 2.1: TorchPatcher.patch, run by the first compile, unwraps each torch.optim
    # class's step from the wrapper that calls the hooks: grad_health went silent.
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))
    step_before = torch.optim.Adam.step

    def program() -> dict[str, object]:
        w = torch.nn.Parameter(torch.full((3,), 2.0))
        optimizer = torch.optim.Adam([w], lr=0.1)
        for step in range(3):
            optimizer.zero_grad()
            (torch.sqrt(((w - 1) * (step != 1)).pow(2).sum()) + w.sum()).backward()
            optimizer.step()
        return outcome([w], optimizer)

    bare, guarded, events = twin(program)
    assert not torch.isfinite(bare["weights"][0]).all()
    assert torch.isfinite(guarded["weights"][0]).all()
    assert [e["action"] for e in events][:1] == ["nonfinite_gradient"]
    assert torch.optim.Adam.step is step_before  # uninstall put torch's own back
    torch._dynamo.reset()


HOOKS_AFTER_A_COMPILE = """
import sys, torch
import torch.optim.optimizer as hooks
if sys.argv[1] == "guarded":
    import autograd_guard
    autograd_guard.install({})
torch.compile(lambda x: x + 1, backend="eager")(torch.ones(1))  # TorchPatcher.patch runs
calls = []
hooks.register_optimizer_step_post_hook(lambda *a: calls.append("global post"))
w = torch.nn.Parameter(torch.ones(2))
opt = torch.optim.RMSprop([w], lr=0.1)  # a class first made after the compile
opt.register_step_pre_hook(lambda *a: calls.append("pre"))
for _ in range(2):
    w.sum().backward()
    opt.step()
print(calls, w.tolist())
"""


def test_a_class_first_made_after_a_compile_keeps_the_users_step_hooks():
    """torch 2.1's first compile marks every torch.optim class hooked (its hooks stop);
    newer torch strips nothing: a class first made after it is hooked by torch then, and
    its step hooks run under the guard as they do bare."""
    import subprocess
    import sys

    runs = [
        subprocess.run(
            [sys.executable, "-c", HOOKS_AFTER_A_COMPILE, how],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout
        for how in ("bare", "guarded")
    ]
    assert runs[0] == runs[1]
    from packaging.version import Version

    newer = Version(torch.__version__).release >= (2, 2)
    assert ("'pre'" in runs[0]) == newer  # 2.1 stops them, bare too


def test_under_torch_compile_the_check_runs_at_a_graph_break():
    net = torch.nn.Linear(3, 3)
    torch.nn.init.zeros_(net.weight)
    torch.nn.init.zeros_(net.bias)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)

    @torch.compile(backend="eager")
    def step():
        optimizer.zero_grad()
        net(torch.ones(2, 3)).pow(2).sum(1).pow(0.5).sum().backward()  # inf at an exact 0
        optimizer.step()

    autograd_guard.install({})
    before = [p.detach().clone() for p in net.parameters()]
    with capture_events() as events:
        for _ in range(3):
            step()
    assert all(torch.equal(b, p) for b, p in zip(before, net.parameters(), strict=True))
    # two steps skipped, the third repaired at the op (its gradient there is 0: the weights
    # stay where they are)
    kinds = [e["action"] for e in events]
    assert kinds == ["nonfinite_gradient", "nonfinite_repaired", "nonfinite_origin"]
    assert events[0]["parameters"] == ["weight", "bias"]  # not Dynamo's own names
    for event in events[1:]:
        forward = event["forward"]  # the compiled function's line, and the op's
        assert forward.startswith(f"{__file__}:") and "pow(0.5)" in forward
    torch._dynamo.reset()


def fused_cpu_supported() -> bool:
    try:
        torch.optim.Adam([torch.nn.Parameter(torch.ones(1))], fused=True)
    except RuntimeError:
        return False
    return True


@pytest.fixture
def cpu_as_cuda(monkeypatch):
    """The CPU takes the CUDA path: the flag is lent to a fused optimizer."""
    from autograd_guard.guards.grad_health import check as _grad_check

    monkeypatch.setattr(_grad_check, "DEFERRED_DEVICE_TYPES", {"cpu", "cuda"})
    return monkeypatch


@pytest.fixture
def syncs(cpu_as_cuda):
    """... and counts the checks that read the flag with a sync before the step."""
    from autograd_guard.guards.grad_health import check as _grad_check

    count = [0]
    real = _grad_check.FiniteCheck.all_finite

    def counted(self, *args):
        count[0] += 1
        return real(self, *args)

    cpu_as_cuda.setattr(_grad_check.FiniteCheck, "all_finite", counted)
    return count


def fused_program(skip_by_hand: bool) -> dict[str, object]:
    w = torch.nn.Parameter(torch.full((3,), 2.0))
    optimizer = torch.optim.Adam([w], lr=0.1, fused=True)
    log: list[object] = []
    hook_log(optimizer, log)
    for step in range(4):
        optimizer.zero_grad()
        (torch.sqrt(((w - 1) * (step != 2)).pow(2).sum()) + w.sum()).backward()
        if not (skip_by_hand and step == 2):
            optimizer.step()
    return outcome([w], optimizer, log=log)


@pytest.mark.skipif(not fused_cpu_supported(), reason="fused Adam needs CUDA in this torch")
def test_a_fused_optimizer_is_lent_the_flag_and_skips_on_the_device(syncs):
    bare, guarded, events = twin(lambda: fused_program(False), canary=False)
    assert syncs == [1]  # the first step only: from then on the flag is lent
    torch.manual_seed(0)
    by_hand = fused_program(True)
    assert_same(guarded["weights"], by_hand["weights"])
    assert_same(guarded["state"], by_hand["state"])  # step count and moments as skipped
    assert_same(guarded["log"][:6], bare["log"][:6])  # the hooks saw the user's gradients
    [event] = [e for e in events if e["action"] == "nonfinite_gradient"]
    assert "fused optimizer skipped this step on the device" in event["event"]
    assert event["parameters"] == ["<unnamed (3,)>"]


@pytest.mark.skipif(not fused_cpu_supported(), reason="fused Adam needs CUDA in this torch")
@pytest.mark.usefixtures("cpu_as_cuda")
def test_a_fused_sgd_whose_first_step_is_not_finite_is_skipped_whole():
    # Lent the flag on its first step, fused SGD leaves the momentum buffer it has just
    # made uninitialised (1e22 weights later): that step is checked with a sync instead.
    def program(skip_by_hand: bool) -> dict[str, object]:
        w = torch.nn.Parameter(torch.full((3,), 2.0))
        optimizer = torch.optim.SGD([w], lr=0.1, momentum=0.9, fused=True)
        for step in range(5):
            optimizer.zero_grad()
            (torch.sqrt(((w - 1) * (step not in (0, 2))).pow(2).sum()) + w.sum()).backward()
            if not (skip_by_hand and step in (0, 2)):
                optimizer.step()
        return outcome([w], optimizer)

    _, guarded, events = twin(lambda: program(False), canary=False)
    torch.manual_seed(0)
    assert_same(guarded, program(True))
    assert [e["action"] for e in events][:1] == ["nonfinite_gradient"]


@pytest.mark.skipif(not fused_cpu_supported(), reason="fused Adam needs CUDA in this torch")
def test_a_lent_flag_leaves_healthy_fused_steps_bit_identical(syncs):
    def program() -> dict[str, object]:
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        for _ in range(6):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()
        return outcome(model.parameters(), optimizer, attrs=sorted(vars(optimizer)))

    bare, guarded, events = twin(program, canary=False)
    assert_same(guarded, bare)  # found_inf is gone after each step, too
    assert events == [] and syncs == [1]
