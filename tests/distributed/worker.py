"""One rank of a real 2-rank grad_health job: torchrun, gloo, CPU.

    python -m torch.distributed.run --standalone --nproc_per_node 2 \\
        tests/distributed/worker.py SCENARIO VARIANT OUTDIR

Every rank builds the same small model (same seed), trains it for ``STEPS`` steps on
data of its own, and a NaN gets in at step ``NAN_STEP`` (where, depends on the scenario).
``SCENARIO+FAULT`` (``ddp_nan_one_rank+hook_catch``) is that scenario's job with no NaN,
where rank 1's optimizer step pre-hook raises at ``NAN_STEP`` and its loop catches the
error (``hook_catch``; at the first step: ``first_hook_catch``) or not (``hook_raise``);
``+skip``: rank 1's loop skips that step after its backward (``continue``);
``+check_fails``: the guard's own check fails on rank 1 at that step. The variant
says who is to deal with it:

- ``plain``, ``observe``, ``fix``, ``strict``: the loop calls ``optimizer.step()`` always
  (the guard, if ``AUTOGRAD_GUARD`` is set, does what its mode says);
- ``handfix``: the hand-written rank-consistent skip (``consumed_finite``): no rank steps
  if any rank's consumed gradients are not finite;
- ``clean``: as ``plain``, with no NaN put in.

Each rank writes ``OUTDIR/rank{N}.pt``: its final weights and optimizer state (rank-local:
local shards for ZeRO and FSDP), the same after every step (``history``), what happened,
and the user name of the parameter it poisoned.
"""

from __future__ import annotations

import atexit
import inspect
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

STEPS = 6
NAN_STEP = 3
NAN = float("nan")


class Job:
    """What a scenario sets up: the model that runs forward, its optimizer, how the NaN
    gets in, and (some_ranks_step) a purely local module and optimizer."""

    def __init__(self, model, optimizer, poison=None, poison_input=False, local=None, **extra):
        self.model = model
        self.optimizer = optimizer
        self.poison = poison  # called after backward at NAN_STEP: returns the name it poisoned
        self.poison_input = poison_input  # rank 1's input is multiplied by NaN at NAN_STEP
        self.local = local  # (module, optimizer) only rank 0 steps, or None
        self.poisoned = None
        # forward and backward of one batch where the model's own call is not it (pipeline)
        self.forward_backward = extra.get("forward_backward")
        self.data_rank = extra.get("data_rank")  # whose data this rank trains on, if not its own
        # rank 1 raises at NAN_STEP, caught or not: before step() ("catch", "raise"), or in
        # its optimizer's step pre-hook ("hook_catch", "hook_raise"); or its loop skips that
        # step after backward (``continue``: "skip"); "eval_one": rank 0 alone runs a
        # forward without grad between backward and step at NAN_STEP; "skip_all_eval_one":
        # every rank skips that step after backward, then rank 0 alone runs one
        self.fault = extra.get("fault")
        self.step_now = -1  # the loop's step (the fault's pre-hook reads it)
        self.steps = extra.get("steps", STEPS)
        self.join = extra.get("join", False)  # the loop runs in DDP's Join context


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def adam(params):
    return torch.optim.Adam(params, lr=0.01)


def ddp(model):
    return nn.parallel.DistributedDataParallel(model)


# -- scenarios: each returns a Job ---------------------------------------------------------


def ddp_nan_one_rank(rank):
    model = ddp(make_model())
    opt = adam(model.parameters())

    def poison():
        if rank != 1:
            return None
        model.module[0].weight.grad[0, 0] = NAN  # after DDP's all-reduce: rank 1's alone
        return "0.weight"

    return Job(model, opt, poison)


def ddp_nan_spread(rank):
    model = ddp(make_model())
    return Job(model, adam(model.parameters()), poison_input=True)


def zero(rank, own_shard):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = ddp(make_model())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    names = {id(p): n for n, p in model.module.named_parameters()}
    shard = {id(p) for group in opt.optim.param_groups for p in group["params"]}

    def poison():
        if rank != 1:
            return None
        mine = [p for p in model.parameters() if (id(p) in shard) == own_shard]
        mine[0].grad.view(-1)[0] = NAN
        return names[id(mine[0])]

    return Job(model, opt, poison)


def zero_own_shard(rank):
    return zero(rank, own_shard=True)


def zero_other_shard(rank):
    return zero(rank, own_shard=False)


def fsdp1_shard_nan(rank):
    from torch.distributed.fsdp import FullyShardedDataParallel

    original = make_model()
    sizes = [(n, p.numel()) for n, p in original.named_parameters()]
    # device_id=None: "FSDP needs a non-CPU accelerator device" (torch 2.13 without CUDA)
    cpu = torch.device("cpu")
    model = FullyShardedDataParallel(original, use_orig_params=False, device_id=cpu)

    def poison():
        if rank != 1:
            return None
        (flat,) = model.parameters()  # this rank's shard of the one flat parameter
        flat.grad[0] = NAN
        # the flat parameter is the original ones in order, cut into equal shards
        offset, start = rank * flat.numel(), 0
        for name, numel in sizes:
            if start <= offset < start + numel:
                return name
            start += numel
        raise AssertionError("the shard starts in padding")

    return Job(model, adam(model.parameters()), poison)


def fsdp2_nan(rank):
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.4-2.5
        from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    model = make_model()
    fully_shard(model, mesh=init_device_mesh("cpu", (2,)))

    def poison():
        if rank != 1:
            return None
        with torch.no_grad():
            model[0].weight.grad.to_local()[0, 0] = NAN  # rank 1 holds rows 4-7 of 0.weight
        return "0.weight"

    return Job(model, adam(model.parameters()), poison)


def some_ranks_step(rank):
    model = ddp(make_model())
    torch.manual_seed(1)
    local = nn.Linear(3, 1)  # not shared: only rank 0 steps its optimizer

    def poison():
        if rank == 0:
            local.weight.grad[0, 0] = NAN
            return "weight"
        return None

    return Job(model, adam(model.parameters()), poison, local=(local, adam(local.parameters())))


def pipeline(rank, nan_stage):
    """Two ``torch.distributed.pipelining`` stages (GPipe, 2 microbatches): rank 0 holds
    the first Linear and the Tanh, rank 1 the last Linear; the NaN goes into
    ``nan_stage``'s gradient."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    full = make_model()
    submod = nn.Sequential(full[0], full[1]) if rank == 0 else nn.Sequential(full[2])
    extra = {}
    wanted = inspect.signature(PipelineStage).parameters.get("input_args")
    if wanted is not None and wanted.default is inspect.Parameter.empty:  # torch 2.4
        extra["input_args"] = (torch.empty(4, 4 if rank == 0 else 8),)  # one microbatch
    stage = PipelineStage(submod, rank, 2, torch.device("cpu"), **extra)
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=F.mse_loss)

    def forward_backward(x, y):
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])

    def poison():
        if rank != nan_stage:
            return None
        submod[0].weight.grad[0, 0] = NAN
        return "0.weight"

    return Job(submod, adam(submod.parameters()), poison, forward_backward=forward_backward)


def pipeline_nan_first_stage(rank):
    return pipeline(rank, 0)


def pipeline_nan_last_stage(rank):
    return pipeline(rank, 1)


def tensor_parallel(mesh):
    """The model with its first Linear split by columns and its last by rows over
    ``mesh`` (DTensor parameters)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model = make_model()
    return parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def poison_slice(model, rank, which):
    """A NaN in rank ``which``'s slice of ``0.weight``'s gradient."""
    if rank != which:
        return None
    with torch.no_grad():
        model[0].weight.grad.to_local()[0, 0] = NAN
    return "0.weight"


def tp_nan_one_slice(rank):
    from torch.distributed.device_mesh import init_device_mesh

    model = tensor_parallel(init_device_mesh("cpu", (2,)))
    return Job(model, adam(model.parameters()), lambda: poison_slice(model, rank, 1), data_rank=0)


def mesh_2x2_nan_one_rank(rank):
    """4 ranks: data parallel (FSDP2) x tensor parallel on a 2 x 2 mesh; a NaN in rank
    3's slice. Ranks 0, 1 train on one batch, ranks 2, 3 on another."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = tensor_parallel(mesh["tp"])
    fully_shard()(model, mesh=mesh["dp"])
    job = Job(model, adam(model.parameters()), lambda: poison_slice(model, rank, 3))
    job.data_rank = rank // 2
    return job


def fully_shard():
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.4-2.5
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def ddp_rank_catches_its_error(rank):
    """No NaN: rank 1 raises before ``step()`` at NAN_STEP and catches it (a batch it
    skips alone, the usual way to survive an OOM); rank 0 steps."""
    model = ddp(make_model())
    return Job(model, adam(model.parameters()), fault="catch")


def ddp_join_uneven(rank):
    """No NaN: uneven inputs under ``Join`` (rank 1 has one batch fewer), DDP over a
    subgroup of every rank whose timeout is short (10 s): rank 1, out of inputs, shadows
    rank 0's last forward and backward; unguarded both finish."""
    from datetime import timedelta

    group = dist.new_group(list(range(dist.get_world_size())), timeout=timedelta(seconds=10))
    model = nn.parallel.DistributedDataParallel(make_model(), process_group=group)
    steps = STEPS if rank == 0 else STEPS - 1
    return Job(model, adam(model.parameters()), steps=steps, join=True)


def ddp_accumulates_no_sync(rank):
    """DDP's accumulation idiom (accelerate's and Lightning's): two forward and backward
    passes per step, the first under ``no_sync()``; no step skipped."""
    model = ddp(make_model())

    def forward_backward(x, y):
        with model.no_sync():
            F.mse_loss(model(x[:4]), y[:4]).backward()
        F.mse_loss(model(x[4:]), y[4:]).backward()

    return Job(model, adam(model.parameters()), forward_backward=forward_backward)


def ddp_local_steps(rank):
    """Every step after a ``no_sync()`` backward (local SGD): each rank steps on its own
    gradients; rank 1's input NaN stays on rank 1."""
    model = ddp(make_model())

    def forward_backward(x, y):
        with model.no_sync():
            F.mse_loss(model(x), y).backward()

    opt = adam(model.parameters())
    return Job(model, opt, forward_backward=forward_backward, poison_input=True)


def ddp_hook_own_group(rank):
    """torch's ``allreduce_hook`` given a group of this rank alone as its state: DDP
    reduces nothing across ranks, so rank 1's input NaN stays on rank 1."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    groups = [dist.new_group([r]) for r in range(dist.get_world_size())]
    model = ddp(make_model())
    model.register_comm_hook(groups[rank], default_hooks.allreduce_hook)
    return Job(model, adam(model.parameters()), poison_input=True)


def ddp_rank_raises(rank):
    """No NaN: rank 1 raises before ``step()`` at NAN_STEP and does not catch it."""
    model = ddp(make_model())
    return Job(model, adam(model.parameters()), fault="raise")


def singular_loss(out, y):
    """A loss with an op at its singular point at every step: sqrt of an exact 0 (a finite
    forward, a NaN backward), the case that grad_health repairs in one process."""
    return F.mse_loss(out, y) + torch.sqrt((out * 0).pow(2).sum())


def ddp_singular_point(rank):
    """The NaN is made by an op at every step on every rank, from the first: ranks that
    decide together never repair (a mended pass on one rank is a change the others do not
    make); each step is skipped on every rank, as the hand-written skip does."""
    model = ddp(make_model())

    def forward_backward(x, y):
        singular_loss(model(x), y).backward()

    opt = adam(model.parameters())
    return Job(model, opt, forward_backward=forward_backward, steps=SINGULAR_STEPS)


def ddp_accumulates(rank):
    """Two forward and backward passes (half a batch each) per step on every rank: gradient
    accumulation, no step skipped."""
    model = ddp(make_model())

    def forward_backward(x, y):
        for half in (slice(0, 4), slice(4, 8)):
            F.mse_loss(model(x[half]), y[half]).backward()

    return Job(model, adam(model.parameters()), forward_backward=forward_backward)


SINGULAR_STEPS = 10  # one process repairs from its 4th step (tests: the single-process twin)


SCENARIOS = {
    f.__name__: f
    for f in (
        ddp_nan_one_rank,
        ddp_nan_spread,
        zero_own_shard,
        zero_other_shard,
        fsdp1_shard_nan,
        fsdp2_nan,
        some_ranks_step,
        pipeline_nan_first_stage,
        pipeline_nan_last_stage,
        tp_nan_one_slice,
        mesh_2x2_nan_one_rank,
        ddp_rank_catches_its_error,
        ddp_rank_raises,
        ddp_join_uneven,
        ddp_singular_point,
        ddp_accumulates,
        ddp_hook_own_group,
        ddp_accumulates_no_sync,
        ddp_local_steps,
    )
}


# -- the training loop ---------------------------------------------------------------------


def local_tensor(t):
    """A DTensor's local shard; any other tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def consumed(optimizer):
    """The parameters whose gradients this rank's optimizer reads."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    inner = optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer
    return [p for group in inner.param_groups for p in group["params"] if p.grad is not None]


def locally_finite(optimizer):
    return all(bool(torch.isfinite(local_tensor(p.grad)).all()) for p in consumed(optimizer))


def consumed_finite(optimizer):
    """The hand-written rank-consistent check: True where every rank's consumed gradients
    are finite (one all-reduce; every rank calls it at every step)."""
    flag = torch.tensor([0.0 if locally_finite(optimizer) else 1.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() == 0.0


def snapshot(job):
    """This rank's weights and optimizer state, rank-local and detached."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    opt = job.optimizer
    inner = opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt
    state = {
        "weights": [copy(p) for p in job.model.parameters()],
        "optimizer": copy(inner.state_dict()),
    }
    if job.local is not None:
        module, local_opt = job.local
        state["local_weights"] = [copy(p) for p in module.parameters()]
        state["local_optimizer"] = copy(local_opt.state_dict())
    return state


def copy(value):
    if isinstance(value, torch.Tensor):
        return local_tensor(value.detach()).clone()
    if isinstance(value, dict):
        return {k: copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(copy(v) for v in value)
    return value


def batch(step, rank):
    generator = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(8, 4, generator=generator), torch.randn(8, 2, generator=generator)


def guard_error():
    """The guard's error class where the guard is on; unguarded runs import nothing of it."""
    if os.environ.get("AUTOGRAD_GUARD"):
        from autograd_guard.errors import GuardError

        return GuardError
    return ()  # catches nothing


def with_fault(scenario, rank, fault):
    """``scenario``'s model, optimizer and data with no NaN; rank 1 raises at NAN_STEP
    (``fault``: caught by the loop or not), in its optimizer's step pre-hook; or (``skip``)
    its loop skips that step after backward."""
    job = SCENARIOS[scenario](rank)
    job.fault = fault
    if fault == "eval_one":  # the scenario's NaN kept
        return job
    job.poison, job.poison_input = None, False
    if fault == "check_fails":
        if rank == 1 and os.environ.get("AUTOGRAD_GUARD"):
            check_fails(job)
        return job
    if rank == 1 and fault != "skip":
        # the first step ("first_hook_catch"), the last ("last_hook_catch") or NAN_STEP
        at = {"first": 0, "last": job.steps - 1}.get(fault.split("_")[0], NAN_STEP)

        def hook(optimizer, args, kwargs):
            if job.step_now == at:
                with open(os.path.join(sys.argv[3], "raised"), "w") as said:
                    said.write(f"rank 1 raised at step {at}\n")  # torchrun may cut it
                raise RuntimeError("out of memory (raised by a step pre-hook)")

        job.optimizer.register_step_pre_hook(hook)
    return job


def check_fails(job):
    """The guard's own check fails at NAN_STEP, before its exchange (it fails open: the
    step runs): a stand-in for a bug of the guard's."""
    from autograd_guard.guards.grad_health import flow

    scaler_decides = flow._scaler_decides

    def failing(*args, **kwargs):
        if job.step_now == NAN_STEP:
            raise RuntimeError("a bug in the guard's check (raised by the test)")
        return scaler_decides(*args, **kwargs)

    flow._scaler_decides = failing


def train(job, rank, variant):
    refused = guard_error()
    inject = variant != "clean"
    history, happened = [], []
    job.seconds = []  # each step's wall time
    for step in range(job.steps):
        started = time.monotonic()
        job.step_now = step
        nan_step = inject and step == NAN_STEP
        x, y = batch(step, rank if job.data_rank is None else job.data_rank)
        if nan_step and job.poison_input and rank == 1:
            x = x * NAN  # the all-reduce spreads it to every rank
        if job.forward_backward is not None:
            job.forward_backward(x, y)
        else:
            loss = F.mse_loss(job.model(x), y)
            if job.local is not None:
                loss = loss + job.local[0](x[:, :3]).pow(2).mean()
            loss.backward()
        if nan_step and job.poison is not None:
            job.poisoned = job.poison()
        if step == NAN_STEP and rank == 0 and job.fault == "eval_one":
            with torch.no_grad():  # rank 0 alone: a forward pass without grad (logging)
                job.model(x)
        leaves = (rank == 1 and job.fault == "skip") or job.fault == "skip_all_eval_one"
        if step == NAN_STEP and leaves:  # if bad: continue
            happened.append(f"skipped step {step}")
            if rank == 0:  # skip_all_eval_one: then rank 0 alone runs one without grad
                with torch.no_grad():
                    job.model(x)
            history.append(snapshot(job))
            job.seconds.append(time.monotonic() - started)
            continue
        stop = False
        try:
            if step == NAN_STEP and rank == 1 and job.fault in ("catch", "raise"):
                raise RuntimeError("out of memory (raised by the test before step())")
            if variant == "handfix" and not consumed_finite(job.optimizer):
                happened.append(f"skipped step {step}")
            else:
                job.optimizer.step()
        except refused:
            happened.append(f"raised at step {step}")
            stop = True
        except RuntimeError:
            if job.fault not in ("catch", "hook_catch", "first_hook_catch", "last_hook_catch"):
                raise
            happened.append(f"caught its error at step {step}")
        job.optimizer.zero_grad()
        if job.local is not None:
            local_step(job, rank, variant, step, happened, refused)
        history.append(snapshot(job))
        job.seconds.append(time.monotonic() - started)
        if stop:
            break
    return history, happened


def local_step(job, rank, variant, step, happened, refused):
    """some_ranks_step: rank 0 alone steps its local optimizer; the hand-written skip is
    local too (no collective). A refusal in strict is recorded and training goes on."""
    opt = job.local[1]
    if rank == 0:
        if variant == "handfix" and not locally_finite(opt):
            happened.append(f"skipped local step {step}")
        else:
            try:
                opt.step()
            except refused:
                happened.append(f"local raised at step {step}")
    opt.zero_grad()


def dcp_resume_after_skip(rank, variant, outdir):
    """DDP with a NaN in rank 1's input at the first step (its all-reduce spreads it); a
    ``torch.distributed.checkpoint`` save right after that step (before the next
    ``zero_grad()``), a fresh model and optimizer loaded from it, two more steps."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = ddp(make_model())
    opt = adam(model.parameters())
    history, happened = [], []
    for step in range(3):
        opt.zero_grad()
        x, y = batch(step, rank)
        if step == 0 and rank == 1:
            x = x * NAN
        F.mse_loss(model(x), y).backward()
        if variant == "handfix" and not consumed_finite(opt):
            happened.append(f"skipped step {step}")
            opt.zero_grad()  # the hand-written skip drops the gradients too
        else:
            opt.step()
        if step == 0:
            path = os.path.join(outdir, "checkpoint")
            weights, state = get_state_dict(model, opt)
            dcp.save({"model": weights, "optim": state}, checkpoint_id=path)
            model = ddp(make_model())
            opt = adam(model.parameters())
            weights, state = get_state_dict(model, opt)
            loaded = {"model": weights, "optim": state}
            dcp.load(loaded, checkpoint_id=path)
            set_state_dict(
                model, opt, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"]
            )
        history.append(snapshot(Job(model, opt)))
    return history, happened


def main():
    scenario, variant, outdir = sys.argv[1:4]
    # the rank given to init_process_group, as mp.spawn, SLURM and MPI launchers do: the
    # guard's events must carry it without a RANK variable, also at exit
    rank, world = int(os.environ.pop("RANK")), int(os.environ.pop("WORLD_SIZE"))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if scenario == "dcp_resume_after_skip":
        job = Job(None, None)
        history, happened = dcp_resume_after_skip(rank, variant, outdir)
    else:
        base, _, fault = scenario.partition("+")  # "ddp_nan_one_rank+hook_catch"
        job = with_fault(base, rank, fault) if fault else SCENARIOS[scenario](rank)
        if job.join:
            from torch.distributed.algorithms.join import Join

            with Join([job.model]):
                history, happened = train(job, rank, variant)
        else:
            history, happened = train(job, rank, variant)
    result = {
        "seconds": getattr(job, "seconds", []),
        "rank": rank,
        "happened": happened,
        "poisoned": job.poisoned,
        "final": history[-1],
        "history": history,
    }
    torch.save(result, os.path.join(outdir, f"rank{rank}.pt"))
    print(f"rank {rank}: {scenario}/{variant}: {happened or 'stepped every step'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # gloo's teardown at interpreter exit sometimes aborts on torch 2.13 ("terminate called
    # without an active exception"), guard or no guard: leave without it, once the exit
    # handlers (the guard's last events) have run.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
