"""Correct training loops that grad_health must leave bit-identical, with no event: each
is a twin run (unguarded, then guarded) comparing weights, optimizer state and what the
user's step hooks saw; a NaN step after each guarded run proves the guard was on."""

from __future__ import annotations

import pytest
import torch
from grad_health_twin import assert_same, hook_log, outcome, twin


def mlp(width: int = 8, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(4, width), torch.nn.Tanh(), torch.nn.Linear(width, 1)
    ).to(dtype)


def accumulation() -> dict[str, object]:
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    log: list[object] = []
    hook_log(optimizer, log)
    for _ in range(5):
        optimizer.zero_grad()
        for _ in range(4):  # four micro-batches per step
            (model(torch.randn(8, 4)).pow(2).mean() / 4).backward()
        optimizer.step()
    return outcome(model.parameters(), optimizer, log=log)


def gan() -> dict[str, object]:
    generator, critic = mlp(), torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Linear(8, 1))
    g_opt = torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.5, 0.9))
    d_opt = torch.optim.Adam(critic.parameters(), lr=1e-3, betas=(0.5, 0.9))
    for _ in range(6):
        fake = generator(torch.randn(8, 4))
        d_opt.zero_grad()
        (critic(fake.detach()).mean() - critic(torch.randn(8, 1)).mean()).backward()
        d_opt.step()
        g_opt.zero_grad()
        (-critic(fake).mean()).backward()  # also fills the critic's gradients
        g_opt.step()
    params = [*generator.parameters(), *critic.parameters()]
    return outcome(params, g_opt, d_opt)


def swa() -> dict[str, object]:
    from torch.optim.swa_utils import SWALR, AveragedModel

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), mlp(8)[2])
    averaged = AveragedModel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    schedule = SWALR(optimizer, swa_lr=0.05, anneal_epochs=2)
    for epoch in range(4):
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()
        if epoch >= 1:
            averaged.update_parameters(model)
            schedule.step()
    torch.optim.swa_utils.update_bn([torch.randn(8, 4) for _ in range(2)], averaged)
    return outcome([*model.parameters(), *averaged.parameters()], optimizer)


def amp() -> dict[str, object]:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = _cpu_scaler()
    for step in range(5):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(8, 4)).float().pow(2).mean()
        if scaler is None:
            loss.backward()
            optimizer.step()
            continue
        scaler.scale(loss * (1e38 if step == 2 else 1.0)).backward()  # one overflow
        scaler.step(optimizer)  # skips the overflow step itself
        scaler.update()
    return outcome(model.parameters(), optimizer)


def _cpu_scaler() -> object:
    try:
        return torch.amp.GradScaler("cpu", init_scale=2.0**8)
    except (AttributeError, TypeError, RuntimeError):  # torch < 2.3: CUDA only
        return None


def bf16_params() -> dict[str, object]:
    model = mlp(dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(5):
        optimizer.zero_grad()
        model(torch.randn(8, 4, dtype=torch.bfloat16)).float().pow(2).mean().backward()
        optimizer.step()
    return outcome(model.parameters(), optimizer)


def sparse_adam() -> dict[str, object]:
    embedding = torch.nn.Embedding(20, 4, sparse=True)
    head = mlp()
    sparse = torch.optim.SparseAdam(list(embedding.parameters()), lr=1e-2)
    dense = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(5):
        sparse.zero_grad()
        dense.zero_grad()
        head(embedding(torch.randint(0, 20, (8,)))).pow(2).mean().backward()
        sparse.step()
        dense.step()
    return outcome([*embedding.parameters(), *head.parameters()], sparse, dense)


def add_param_group() -> dict[str, object]:
    body, head = mlp(), torch.nn.Linear(1, 1)
    optimizer = torch.optim.Adam(body.parameters(), lr=1e-2)
    for step in range(6):
        if step == 3:  # unfreeze the head mid-run
            optimizer.add_param_group({"params": head.parameters(), "lr": 1e-3})
        optimizer.zero_grad()
        out = body(torch.randn(8, 4))
        (head(out) if step >= 3 else out).pow(2).mean().backward()
        optimizer.step()
    return outcome([*body.parameters(), *head.parameters()], optimizer)


def lbfgs() -> dict[str, object]:
    model = mlp()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, line_search_fn="strong_wolfe")
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    calls = [0]

    def closure() -> torch.Tensor:
        calls[0] += 1
        optimizer.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        return loss

    for _ in range(3):
        optimizer.step(closure)
    return outcome(model.parameters(), optimizer, calls=calls[0])


def closure_every_step() -> dict[str, object]:
    """Lightning passes a closure to every optimizer."""
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    log: list[object] = []
    hook_log(optimizer, log)
    for _ in range(5):

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            return loss

        optimizer.step(closure=closure)
    return outcome(model.parameters(), optimizer, log=log)


def scheduled_zeroed() -> dict[str, object]:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    for _ in range(6):
        optimizer.zero_grad(set_to_none=False)
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
        schedule.step()
    return outcome(model.parameters(), optimizer)


def fused_adam() -> dict[str, object]:
    model = mlp()
    try:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, fused=True)
    except RuntimeError:  # no fused optimizer for the CPU in this torch
        pytest.skip("fused Adam needs CUDA in this torch")
    for _ in range(5):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
    return outcome(model.parameters(), optimizer)


def schedulers() -> dict[str, object]:
    """OneCycle, ReduceLROnPlateau and SequentialLR, each stepped after its optimizer."""
    lr = torch.optim.lr_scheduler
    models = [mlp(), mlp(), mlp()]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in models]
    one_cycle = lr.OneCycleLR(optimizers[0], max_lr=0.5, total_steps=6)
    plateau = lr.ReduceLROnPlateau(optimizers[1], patience=0)
    sequential = lr.SequentialLR(
        optimizers[2],
        [lr.LinearLR(optimizers[2], 0.5, total_iters=2), lr.ExponentialLR(optimizers[2], 0.9)],
        milestones=[2],
    )
    for _ in range(6):
        losses = []
        for model, optimizer in zip(models, optimizers, strict=True):
            optimizer.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        one_cycle.step()
        plateau.step(losses[1])
        sequential.step()
    params = [p for m in models for p in m.parameters()]
    states = [s.state_dict() for s in (one_cycle, plateau)]
    return outcome(params, *optimizers, schedulers=states)


def per_parameter_steps_in_backward() -> dict[str, object]:
    """An optimizer per parameter, stepped from a post-accumulate-grad hook (torch's
    recipe for fusing the step into backward)."""
    model = mlp()
    optimizers = {p: torch.optim.Adam([p], lr=1e-2) for p in model.parameters()}
    if not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
        pytest.skip("no post-accumulate-grad hooks in this torch")

    def step(param: torch.Tensor) -> None:
        optimizers[param].step()
        optimizers[param].zero_grad()

    for param in model.parameters():
        param.register_post_accumulate_grad_hook(step)
    for _ in range(4):
        model(torch.randn(8, 4)).pow(2).mean().backward()
    return outcome(model.parameters(), *optimizers.values())


def differentiable_sgd() -> dict[str, object]:
    """A meta-learning step: ``differentiable=True`` keeps the update in the graph, and
    the gradient of the updated weights flows back to the gradient that was used."""
    w = torch.nn.Parameter(torch.ones(3))
    given = torch.full((3,), 0.5, requires_grad=True)
    inner = w.clone()
    optimizer = torch.optim.SGD([inner], lr=0.1, momentum=0.9, differentiable=True)
    for _ in range(3):
        inner.grad = given * 1.0
        optimizer.step()
    (inner * torch.arange(3.0)).sum().backward()
    return outcome([w], optimizer, given_grad=given.grad, w_grad=w.grad)


def resumed_from_a_checkpoint() -> dict[str, object]:
    """Save, deepcopy, load a state_dict into a new optimizer and train on."""
    import copy

    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _epoch in range(2):
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()
        saved = copy.deepcopy(optimizer.state_dict())
        clone = copy.deepcopy(optimizer)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        optimizer.load_state_dict(saved)
        del clone
    return outcome(model.parameters(), optimizer)


LOOPS = [
    schedulers,
    per_parameter_steps_in_backward,
    differentiable_sgd,
    resumed_from_a_checkpoint,
    accumulation,
    gan,
    swa,
    amp,
    bf16_params,
    sparse_adam,
    add_param_group,
    lbfgs,
    closure_every_step,
    scheduled_zeroed,
    fused_adam,
]


@pytest.mark.parametrize("loop", LOOPS, ids=[loop.__name__ for loop in LOOPS])
def test_a_correct_loop_is_bit_identical_and_silent_in_fix(loop):
    bare, guarded, events = twin(loop)
    assert_same(guarded, bare)
    assert events == []


@pytest.mark.parametrize("mode", ["observe", "strict"])
@pytest.mark.parametrize("loop", [gan, lbfgs, sparse_adam], ids=["gan", "lbfgs", "sparse_adam"])
def test_a_correct_loop_is_bit_identical_and_silent_in_every_mode(loop, mode):
    bare, guarded, events = twin(loop, {"mode": mode})
    assert_same(guarded, bare)
    assert events == []
