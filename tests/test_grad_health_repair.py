"""grad_health's repair at the origin, on real singular points of four libraries' functions
(RoMa, PyTorch3D, torch's softmax and log): under fix, the repaired run converges like the
reference (the fixed release, or the documented manual fix); a one-off NaN stays a plain
skip; a divergence (a non-finite loss) is never repaired; a repair that does not train is
a stall; observe says what fix would do; the repairing pass reads nothing on the host."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import grad_health_singular as singular
import pytest
import thirdparty
import torch

import autograd_guard
from autograd_guard.testing import capture_events

SKIP = {"guards": {"grad_health": {"nonfinite_fix": "skip"}}}


def guarded(fit, policy=None, **kwargs):
    autograd_guard.install(policy or {})
    with capture_events() as events:
        result = fit(**kwargs)
    return result, [e for e in events if e["guard"] == "grad_health"]


def assert_converges_like(result, reference, tolerance):
    """The same solution within ``tolerance``, and a final loss within 5% (or both at 0)."""
    (loss, solution), (ref_loss, ref_solution) = result, reference
    assert (torch.as_tensor(solution) - torch.as_tensor(ref_solution)).abs().max() < tolerance
    assert abs(loss - ref_loss) <= 0.05 * abs(ref_loss) or max(loss, ref_loss) < 1e-6


def actions(events):
    return [e["action"] for e in events]


@pytest.mark.parametrize(
    ("fit", "op", "tolerance"),
    [
        (singular.masked_attention, "PowBackward0", 1e-2),
        (singular.soft_distance, "LogBackward0", 1e-3),
        (singular.regularised_rotation, "AcosBackward0", 1e-3),
    ],
)
def test_fix_repairs_a_recurring_singular_point_and_converges_like_the_reference(
    fit, op, tolerance
):
    reference = fit(fixed=True)
    result, events = guarded(fit)
    assert_converges_like(result, reference, tolerance)
    assert actions(events)[:3] == ["nonfinite_gradient", "nonfinite_repaired", "nonfinite_origin"]
    repaired = events[1]
    assert repaired["op"] == op and repaired["step"] == 3  # two steps skipped, then repaired
    assert "The gradient was changed" in repaired["event"] and "set to 0" in repaired["event"]
    [done] = [e for e in events if e["action"] == "steps_repaired"] or [None]
    assert done is None or done["steps"] >= 1  # said at exit (here: the capture ends first)


def test_skip_keeps_skipping_every_step():
    (loss, _), events = guarded(singular.soft_distance, SKIP, steps=25)
    assert loss != loss or loss > 1.0  # untrained
    assert "nonfinite_repaired" not in actions(events)
    assert "training_stalled" in actions(events)


def rotation(folder, policy, steps=150):
    code = singular.ROTATION_FIT.format(folder=str(folder), policy=policy, steps=steps)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    found = json.loads(result.stdout)
    return (found["loss"], found["solution"]), found["events"]


def test_roma_rotation_fit_from_the_identity_converges_like_the_fixed_release():
    reference, quiet = rotation(thirdparty.install("roma-1.3.0"), None)
    assert quiet == []
    affected = thirdparty.install("roma-1.2.1")
    skipped, events = rotation(affected, SKIP, steps=25)
    assert skipped[1] == [0.0, 0.0, 0.0] and "training_stalled" in actions(events)
    result, events = rotation(affected, {})
    assert_converges_like(result, reference, 1e-3)
    repaired, origin = events[1:3]
    assert repaired["action"] == "nonfinite_repaired" and repaired["step"] == 3
    assert repaired["forward"].endswith("roma/mappings.py:372")  # inside RoMa's code
    assert origin["made"] == "div" and origin["made_at"].endswith("roma/mappings.py:359")


def test_a_one_off_nan_is_a_plain_skip():
    w = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([w], lr=0.1)
    autograd_guard.install({})
    with capture_events() as events:
        for step in range(6):
            scale = 0.0 if step == 2 else 1.0  # one bad batch
            loss = torch.sqrt(((w - 2) * scale).pow(2).sum())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert actions(events) == ["nonfinite_gradient", "nonfinite_origin"]
    assert "one-off" in events[1]["event"]


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("module", singular.MODULES)
def test_torch_s_attention_modules_are_repaired_like_the_finite_fill(module, batch_first):
    """torch's own attention (issue 49): nn.MultiheadAttention (need_weights either way),
    nn.TransformerEncoderLayer (norm_first either way: a LayerNorm over the row) and
    F.scaled_dot_product_attention with a boolean mask. A fully masked query row is NaN in
    the forward pass, the loss leaves it out. Where this torch makes the NaN, fix repairs
    it (matrix products, LayerNorm and the fused attention kernel recomputed, softmax
    masked) and the run is the manual fix's (-1e9 fills) with the two steps fix skips
    before repair begins skipped by hand; where this torch's kernels give the row 0 (2.5
    and newer, all but need_weights=True), the guard is silent and the run unchanged."""
    kwargs = {"module": module, "batch_first": batch_first, "steps": 60}
    plain = singular.module_attention(**kwargs)
    result, events = guarded(singular.module_attention, **kwargs)
    if plain[0] == plain[0]:  # finite: nothing to repair on this torch
        assert module != "attention" and not events
        assert result[0] == plain[0] and torch.equal(result[1], plain[1])
        return
    assert actions(events) == ["nonfinite_gradient", "nonfinite_repaired", "nonfinite_origin"]
    reference = singular.module_attention(fixed=True, skipped=2, **kwargs)
    assert abs(result[0] - reference[0]) <= 1e-3 * reference[0]
    # the key bias's true gradient is 0 (softmax is shift-invariant): Adam steps on its
    # rounding noise, which differs between torch's fused kernel and the recomputation
    others = torch.ones_like(result[1], dtype=torch.bool)
    others[200:208] = False
    assert (result[1] - reference[1])[others].abs().max() < 1e-4


def test_a_non_finite_loss_is_never_repaired():
    """A divergence: the learning rate sends the loss to inf; every step stays a skip and
    the stall is said."""
    w = torch.nn.Parameter(torch.full((4,), 1e30))
    optimizer = torch.optim.SGD([w], lr=0.1)
    autograd_guard.install({"guards": {"grad_health": {"stall_steps": 5}}})
    with capture_events() as events:
        for _ in range(8):
            loss = (w * w).sum() * 1e10  # inf
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert "nonfinite_repaired" not in actions(events)
    assert "training_stalled" in actions(events)
    assert torch.equal(w.detach(), torch.full((4,), 1e30))


def test_an_infeasible_ctc_sample_names_the_loss_not_the_weights():
    """One infeasible sample (2 frames for 4 labels) makes CTC's loss inf at every step,
    with finite weights and inputs (issue 49): the steps are skipped, the loss's op is
    named, and the gradient's origin says the pass began at a non-finite loss, never that
    the weights or inputs were non-finite."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x, targets = torch.randn(6, 3, 8), torch.randint(1, 5, (3, 4))
    autograd_guard.install({})
    with capture_events() as events:
        for _ in range(5):
            optimizer.zero_grad()
            logp = model(x).log_softmax(-1)
            loss = torch.nn.functional.ctc_loss(
                logp, targets, torch.tensor([6, 6, 2]), torch.tensor([4, 3, 4]), reduction="sum"
            )
            loss.backward()
            optimizer.step()
    assert not optimizer.state and "nonfinite_repaired" not in actions(events)
    origins = [e for e in events if e["action"] == "nonfinite_origin"]
    [of_loss] = [e for e in origins if e.get("of") == "loss"]
    assert "ctc_loss" in of_loss["event"]
    [of_gradient] = [e for e in origins if e.get("of") != "loss"]
    assert "began at a non-finite loss" in of_gradient["event"]
    assert "weights or inputs" not in of_gradient["event"]
    assert "zero_infinity" in of_gradient["remedy"]


def test_a_non_finite_forward_value_the_loss_uses_is_never_repaired():
    w = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([w], lr=0.1)
    autograd_guard.install({"guards": {"grad_health": {"stall_steps": 5}}})
    with capture_events() as events:
        for _ in range(8):
            loss = torch.log(w - 1).sum()  # log(0) = -inf, and the loss is -inf
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert "nonfinite_repaired" not in actions(events) and "training_stalled" in actions(events)


def test_a_repair_that_does_not_train_is_a_stall():
    """The rotation angle alone, at the identity, with acos unbounded: 0 is its gradient's
    limit, and nothing else moves the parameters: the loss cannot fall."""
    from pytorch3d.transforms import so3_exp_map, so3_rotation_angle

    log_rotation = torch.nn.Parameter(torch.zeros(1, 3))
    optimizer = torch.optim.SGD([log_rotation], lr=0.1)
    autograd_guard.install({"guards": {"grad_health": {"stall_steps": 5}}})
    with capture_events() as events:
        for _ in range(12):
            angle = so3_rotation_angle(so3_exp_map(log_rotation), cos_bound=0.0)
            loss = (angle - 0.5).pow(2).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    stalled = [e for e in events if e["action"] == "training_stalled"]
    assert stalled and "repair stopped" in stalled[0]["event"]


def test_parameters_that_repair_leaves_where_they_are_are_named_while_the_loss_falls():
    """A norm at 0 in front of ``w``: its repaired gradient is 0, so ``w`` never moves,
    while ``b`` trains and the loss falls; said once, as a warning, and repair goes on."""
    w, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([w, b], lr=0.1)
    autograd_guard.install({"guards": {"grad_health": {"stall_steps": 5}}})
    with capture_events() as events:
        for _ in range(12):
            loss = torch.sqrt((w * w).sum()) + (b - 3).pow(2).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    [stuck] = [e for e in events if e["action"] == "repair_stuck"]
    assert "have not moved" in stuck["event"] and "repair goes on" in stuck["event"]
    assert stuck["level"] == "warning" and "training_stalled" not in actions(events)
    assert torch.equal(w.detach(), torch.zeros(3)) and b.item() > 2.0


def test_observe_says_what_fix_would_do_and_changes_nothing():
    reference = singular.soft_distance(steps=6)
    result, events = guarded(singular.soft_distance, {"mode": "observe"}, steps=6)
    events = [e for e in events if e["action"] != "nonfinite_loss" and "of" not in e]
    assert result[0] != result[0] or torch.equal(result[1], reference[1])  # as unguarded
    first = events[0]
    assert first["action"] == "nonfinite_gradient" and "the step ran with them" in first["event"]
    assert "fix would skip it, and once the same backward op" in first["event"]
    assert "observe let steps with non-finite gradients through" in events[1]["event"]


def test_strict_raises_at_the_first_non_finite_step():
    with pytest.raises(autograd_guard.GuardError):
        guarded(singular.soft_distance, {"mode": "strict"}, steps=3)


def test_a_repairing_pass_reads_nothing_on_the_host(monkeypatch):
    """On CUDA a read is a sync: the repairing backward pass makes none (its flags are
    read later, once ready); counted here by every way a tensor reaches the host."""
    autograd_guard.install({})
    w = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([w], lr=0.01)
    reads = []

    def backward_then_step(count):
        loss = torch.log(torch.exp(-1e4 * w)).clamp(min=-100.0).sum() + w.sum()
        optimizer.zero_grad()
        if count:
            for name in ("item", "tolist", "__bool__", "__float__", "__int__", "numpy"):
                original = getattr(torch.Tensor, name)
                monkeypatch.setattr(torch.Tensor, name, _counting(original, name, reads))
        loss.backward()
        monkeypatch.undo()
        optimizer.step()

    with capture_events() as events:
        for step in range(6):
            backward_then_step(count=step >= 4)  # repair began at step 3
    assert "nonfinite_repaired" in actions(events)
    assert reads == []


def _counting(original, name, reads):
    def counted(self, *args, **kwargs):
        if not sys._getframe(1).f_code.co_filename.endswith("loss.py"):  # read at once on
            reads.append(name)  # the CPU only (a CUDA loss's flag is read once it is ready)
        return original(self, *args, **kwargs)

    return counted


def sqrtm_fit(skip_by_hand=False, steps=12):
    """A matrix square root through ``eigh`` (the form of a library release whose fixed
    release solves a Sylvester equation), at ``scale * I``: repeated eigenvalues at every
    step, where eigh's backward divides by their differences (NaN). A head beside it."""
    torch.manual_seed(0)
    target = torch.randn(4, 4, dtype=torch.float64)
    target = target @ target.T + torch.eye(4, dtype=torch.float64)
    scale = torch.nn.Parameter(torch.ones(1, dtype=torch.float64))
    head = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.float64))
    optimizer = torch.optim.Adam([scale, head], lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        w, v = torch.linalg.eigh(scale * torch.eye(4, dtype=torch.float64))
        root = v @ torch.diag_embed(w.clamp_min(0).sqrt()) @ v.transpose(-1, -2)
        (root + head - target).pow(2).sum().backward()
        grads = [p.grad for p in (scale, head)]
        if skip_by_hand and not all(bool(torch.isfinite(g).all()) for g in grads):
            continue
        optimizer.step()
    return [scale.detach().clone(), head.detach().clone()], optimizer.state_dict()["state"]


def test_a_spectral_singular_point_is_never_repaired_and_says_why():
    """0 is not the limit of eigh's gradient at repeated eigenvalues (issue 49): fix skips
    those steps exactly as a hand-written skip does, never ``nonfinite_repaired``, and the
    origin event says why repair does not begin (said only where repair is on)."""
    by_hand = sqrtm_fit(skip_by_hand=True)
    result, events = guarded(sqrtm_fit)
    assert "nonfinite_repaired" not in actions(events)
    [origin] = [e for e in events if e["action"] == "nonfinite_origin"]
    assert origin["op"] == "LinalgEighBackward0"
    assert (
        "is not repaired" in origin["event"] and "0 is not the gradient's limit" in origin["event"]
    )
    assert "Sylvester" in origin["remedy"]
    assert all(torch.equal(a, b) for a, b in zip(result[0], by_hand[0], strict=True))
    assert result[1] == by_hand[1] == {}  # no step taken, as by hand
    autograd_guard.uninstall()
    _, skipping = guarded(sqrtm_fit, SKIP)  # no repair to decline: nothing said of one
    [origin] = [e for e in skipping if e["action"] == "nonfinite_origin"]
    assert "is not repaired" not in origin["event"]


def test_repair_that_cannot_begin_says_why_once():
    """A pointwise convolution over a position whose forward value is NaN (made by ``log``
    in a branch ``torch.where`` drops) that the loss leaves out: the convolution's weight
    gradient sums over it, a kind repair cannot mend (issue 49). The steps are skipped;
    the one nonfinite_origin says the node is not repaired and why, and never blames
    weights or inputs that were finite."""
    torch.manual_seed(0)
    conv, scale = torch.nn.Conv1d(2, 2, 1), torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.Adam([*conv.parameters(), scale], lr=0.01)
    x = torch.randn(1, 2, 8)
    valid = torch.ones(1, 2, 8, dtype=torch.bool)
    valid[..., 7] = False
    autograd_guard.install({})
    with capture_events() as events:
        for _ in range(6):
            optimizer.zero_grad()
            h = torch.where(valid, x * scale, torch.log(x * scale - 100))
            y = conv(h)
            torch.where(valid, y, torch.zeros_like(y)).pow(2).sum().backward()
            optimizer.step()
    assert "nonfinite_repaired" not in actions(events) and not optimizer.state
    [origin] = [e for e in events if e["action"] == "nonfinite_origin"]
    assert "ConvolutionBackward0 is not repaired" in origin["event"]
    assert "weights or inputs" not in origin["event"]


class TiedSquare(torch.autograd.Function):
    """u**2, with a backward written as a library might: 2u scaled by (u - v) / (u - v)
    for each element's partner v, 0/0 where they tie. The limit there is 2u, not 0; the
    elements come in tied pairs whatever the weight, so every pass meets the point."""

    @staticmethod
    def forward(ctx, u):
        ctx.save_for_backward(u)
        return u * u

    @staticmethod
    def backward(ctx, grad):
        (u,) = ctx.saved_tensors
        partner = u.flip(0)
        return grad * 2 * u * (u - partner) / (u - partner)


def test_a_repair_that_ends_worse_than_skipping_is_said():
    """loss = (w - 3)**2 + 4 * sum(TiedSquare(w * [1, 1])), from w = 0 (loss 9): with the
    tied term's gradient repaired to 0, w walks to 3 and the loss, after falling to 8,
    climbs past 9 towards 72; skipping would have kept w at 0. Fix says ``repair_worse``
    once the loss has stayed above 9 for stall_steps repaired passes and is rising; the
    loss may have changed by itself (a schedule), so the repair goes on, said once."""
    w = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([w], lr=0.01)
    pair = torch.ones(2)
    autograd_guard.install({"guards": {"grad_health": {"stall_steps": 6}}})
    losses = []
    with capture_events() as events:
        for _ in range(60):
            loss = (w - 3).pow(2).sum() + 4 * TiedSquare.apply(w * pair).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    said = actions(events)
    assert said[:3] == ["nonfinite_gradient", "nonfinite_repaired", "nonfinite_origin"]
    assert min(losses) < 8.5  # it fell first
    [worse] = [e for e in events if e["action"] == "repair_worse"]
    assert "worse than skipping" in worse["event"] and "above 9," in worse["event"]
    assert "The repair goes on" in worse["event"] and 'nonfinite_fix = "skip"' in worse["remedy"]
    assert "training_stalled" not in said and w.item() > 1.5  # repaired on: towards 3


def test_a_repaired_loss_above_an_easy_first_batch_but_not_rising_is_not_worse():
    """Noisy batches: the batch where the repair began was unusually easy, so every later
    loss sits above it; the loss is flat, not rising: no repair_worse (a hostile review
    found the first rule fired here)."""
    w = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([w], lr=0.0)  # the weights stay: the loss is the batches'
    pair = torch.ones(2)
    autograd_guard.install({"guards": {"grad_health": {"stall_steps": 6}}})
    generator = torch.Generator().manual_seed(0)
    with capture_events() as events:
        for step in range(40):
            level = 1.0 if step < 3 else 2.0 + torch.rand((), generator=generator).item()
            loss = level * (w - 3).pow(2).sum() + TiedSquare.apply(w * pair).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    said = actions(events)
    assert "nonfinite_repaired" in said and "repair_worse" not in said


RANKS = """
import json, os, sys, torch
import torch.distributed as dist
import torch.multiprocessing as mp

def worker(rank, log):
    os.environ.update(RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    import autograd_guard
    options = {"stall_steps": 0}
    autograd_guard.install({"log": log, "mode": sys.argv[3], "guards": {"grad_health": options}})
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[3] = False  # query 3 sees no key: its softmax row is NaN, the loss leaves it out
    for step in range(6):
        optimizer.zero_grad()
        x = model(torch.randn(4, 4))
        scores = (x @ x.T).masked_fill(~mask, float("-inf"))
        out = torch.softmax(scores, -1) @ x
        out[:3].pow(2).sum().backward()
        optimizer.step()
    unchanged = all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    print(json.dumps({"rank": rank, "unchanged": unchanged}), flush=True)
    dist.barrier()
    os._exit(0)

if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[2],), nprocs=2)
"""


@pytest.mark.parametrize("mode", ["fix", "observe"])
def test_where_the_ranks_decide_together_repair_does_not_begin_and_says_why(tmp_path, mode):
    """Two DDP ranks meet a fully masked softmax row every step: fix does not repair (a
    mended gradient on one rank is a change the other does not make), skips every step on
    both ranks, and the origin says why repair did not begin (issue 49); observe, which
    lets the steps through, says the same of fix where it names the op (its next pass may
    run on weights already NaN), never that fix would repair."""
    import socket

    from helpers import run_python

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "ranks.py").write_text(RANKS)
    log = tmp_path / "events.jsonl"
    code = (
        f"import runpy, sys; sys.argv = ['ranks.py', '{port}', {str(log)!r}, {mode!r}]; "
        "runpy.run_path('ranks.py', run_name='__main__')"
    )
    out = run_python(sys.executable, code, tmp_path, PYTHONPATH=":".join(sys.path))
    ranks = [json.loads(m) for m in re.findall(r'\{"rank": \d, "unchanged": \w+\}', out.stdout)]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert all(r["unchanged"] == (mode == "fix") for r in ranks)  # observe: NaN weights
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert "nonfinite_repaired" not in actions(events)
    steps = [e for e in events if e["action"] == "nonfinite_gradient"]
    assert steps and not any("set them to 0" in e["event"] for e in steps)
    origins = [e for e in events if e["action"] == "nonfinite_origin" and e.get("of") != "loss"]
    # the op named (in observe a later pass may run on weights the NaN steps made NaN:
    # said so, with no op and no repair to speak of)
    named = [e for e in origins if e.get("made") == "softmax"]
    assert named or mode == "observe"
    assert all("decide a step together" in e["event"] for e in named)
    assert all("made" in e or "weights or inputs" in e["event"] for e in origins)


def procrustes(function, policy, steps=40):
    code = singular.PROCRUSTES_FIT.format(
        folder=str(thirdparty.install("roma-1.3.0")), policy=policy, steps=steps, function=function
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(result.stdout)


def test_a_spectral_backward_in_a_real_library_is_skipped_with_the_true_words():
    """RoMa's special_procrustes_naive from the identity (issue 49): SVD's backward at
    repeated singular values, where 0 is not the limit. Unguarded, the NaN reaches the
    matrix and the next SVD raises; RoMa's special_procrustes (its own backward) fits.
    fix never repairs it: every step is skipped, exactly as a hand-written skip (the matrix
    stays the identity), and the origin names the SVD in RoMa's function, why it is not
    repaired, and RoMa's fix."""
    reference = procrustes("special_procrustes", None)
    assert reference["error"] is None and reference["loss"] < 0.05
    assert "LinAlgError" in procrustes("special_procrustes_naive", None)["error"]
    found = procrustes("special_procrustes_naive", {})
    assert found["error"] is None and found["matrix"] == torch.eye(3).tolist()
    said = actions(found["events"])
    assert "nonfinite_repaired" not in said and "training_stalled" in said
    [origin] = [e for e in found["events"] if e["action"] == "nonfinite_origin"]
    assert "SvdBackward" in origin["op"] and origin["within"].endswith("special_procrustes_naive")
    assert "is not repaired" in origin["event"]
    assert "0 is not the gradient's limit" in origin["event"]
    assert "roma.special_procrustes computes the same" in origin["remedy"]


def normed_attention(norm, fixed=False, skipped=0, steps=40):
    """A hand-written masked attention (query 5 sees no key: NaN row, left out by the
    loss) under torch's own nn.LayerNorm or nn.RMSNorm, then a head."""
    torch.manual_seed(0)
    length, width = 6, 8
    x, target = torch.randn(length, width), torch.randn(length, 1)
    q, k, v = (torch.nn.Linear(width, width) for _ in range(3))
    normal = getattr(torch.nn, norm)(width)
    head = torch.nn.Linear(width, 1)
    params = [p for m in (q, k, v, normal, head) for p in m.parameters()]
    optimizer = torch.optim.Adam(params, lr=0.01)
    mask = torch.ones(length, length, dtype=torch.bool).tril()
    mask[5] = False
    valid = torch.arange(length) < 5
    for step in range(steps):
        scores = (q(x) @ k(x).T).masked_fill(~mask, -1e9 if fixed else float("-inf"))
        y = head(normal(torch.softmax(scores, -1) @ v(x)))
        loss = (y - target)[valid].pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        if step >= skipped:
            optimizer.step()
    return loss.item(), torch.cat([p.detach().flatten() for p in params])


@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
def test_a_normalisation_over_a_row_the_loss_leaves_out_is_repaired(norm):
    """A NaN row through torch's LayerNorm (recomputed) or RMSNorm (torch composes it of
    pow, mean, rsqrt and a broadcasting mul: recomputed): the run is the -1e9 fill's with
    the two steps fix skips skipped by hand, to float rounding (issue 49)."""
    if not hasattr(torch.nn, norm):
        pytest.skip(f"torch {torch.__version__} has no nn.{norm} (2.4 and newer)")
    plain = normed_attention(norm)[0]
    assert plain != plain  # NaN unguarded
    result, events = guarded(normed_attention, norm=norm)
    assert actions(events) == ["nonfinite_gradient", "nonfinite_repaired", "nonfinite_origin"]
    reference = normed_attention(norm, fixed=True, skipped=2)
    assert abs(result[0] - reference[0]) <= 1e-5 * reference[0]
    assert (result[1] - reference[1]).abs().max() < 1e-5


def cross_attention(fixed=False, skipped=0, steps=40):
    """A self-attention whose last query sees no key (NaN row, -1e9 in the fix), then a
    cross-attention over a finite memory whose query holds that row: torch 2.1's and
    2.4's fused CPU kernels save the NaN query; the loss leaves the row out."""
    functional = torch.nn.functional
    torch.manual_seed(0)
    length, memory_length, width = 6, 5, 8
    x, memory = torch.randn(1, 1, length, width), torch.randn(1, 1, memory_length, width)
    target = torch.randn(1, 1, length, width)
    layers = [torch.nn.Linear(width, width) for _ in range(6)]
    q1, k1, v1, q2, k2, v2 = layers
    params = [p for layer in layers for p in layer.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.005)
    mask = torch.ones(length, length, dtype=torch.bool).tril()
    mask[5] = False
    if fixed:
        mask = torch.zeros(length, length).masked_fill(~mask, -1e9)
    valid = torch.arange(length) < 5
    for step in range(steps):
        h = functional.scaled_dot_product_attention(q1(x), k1(x), v1(x), attn_mask=mask)
        out = functional.scaled_dot_product_attention(q2(h), k2(memory), v2(memory))
        loss = (out - target)[:, :, valid].pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        if step >= skipped:
            optimizer.step()
    return loss.item(), torch.cat([p.detach().flatten() for p in params])


def test_a_cross_attention_over_a_fully_masked_row_is_repaired_like_the_fill():
    """The NaN row is the cross-attention's query (issue 49, a hostile review): its key
    projection's gradient is recomputed with that row as 0 (it was 0 x NaN everywhere,
    then masked: no gradient at all). Like the -1e9 fill where this torch makes the NaN;
    silent and unchanged where it does not (2.5 and newer)."""
    plain = cross_attention()
    result, events = guarded(cross_attention)
    if plain[0] == plain[0]:
        assert not events and result[0] == plain[0] and torch.equal(result[1], plain[1])
        return
    assert "nonfinite_repaired" in actions(events)
    reference = cross_attention(fixed=True, skipped=2)
    assert (result[1] - reference[1]).abs().max() < 1e-5
