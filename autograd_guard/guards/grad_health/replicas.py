"""Plain DDP decides without the guard's exchange: after DDP's all-reduce every rank holds
the same gradients, so every rank reaches the same verdict on them alone.

Symptom (of exchanging anyway): the guard's exchange is one small gloo all-reduce per
optimizer step on top of DDP's own (+1 to +1.5 ms on a 2-rank CPU job, over the 1.05x
goal at a 30 ms step), a rendezvous the unguarded job does not have: a rank that leaves
a step by its own code with no later forward pass (its last step, say, then a barrier)
keeps the others waiting in it up to the guard's timeout. Any torch with
``torch.distributed``.

Remedy: a step whose gradients DDP has made the same on every rank is decided by each
rank on its own gradients, with nothing exchanged, and the skip watch posts nothing for a
step so decided (``skips``). DDP relies on the same fact: its replicas stay the same
because their updates are. A step is decided so where:

- every parameter the optimizer holds belongs to a ``DistributedDataParallel`` whose
  process group spans exactly the model's ranks, with no parameter it ignores, and whose
  ``forward`` is DDP's own;
- its communication hook keeps the reduced gradient the same on every rank: none,
  torch's all-reduce, fp16 or bf16 compression, PowerSGD, DDP's mixed-precision upcast
  (not post-local SGD, which reduces within subgroups, nor a hook the guard does not
  know; read once, at the optimizer's first shared step);
- its last forward pass set up a synchronised backward (``require_forward_param_sync``,
  which DDP's forward sets: False under ``no_sync()`` or with grad disabled), on a DDP
  whose forward sets it (not the Python reducer of compiled autograd, nor
  ``delay_all_reduce_named_params`` covering every parameter).

Anything else exchanges as before: ZeRO, FSDP, DTensor, pipelining, a local parameter
beside DDP's, an unknown hook, a step right after a ``no_sync()`` forward. The conditions
read the same on every rank of a job DDP can run (DDP itself needs the same model, hook
and synchronisation on every rank), so the ranks choose alike.
"""

from __future__ import annotations

import sys
import weakref

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_DDP = ("torch.nn.parallel.distributed", "DistributedDataParallel")
# communication hooks whose reduced gradient is the same on every rank, as DDP's logging
# data names them (a wrapper of another hook is not among them: its inner hook may not be)
SAME_ON_EVERY_RANK = frozenset(
    {
        "allreduce_hook",
        "fp16_compress_hook",
        "bf16_compress_hook",
        "powerSGD_hook",
        "batched_powerSGD_hook",
        "_reducer_allreduce_and_upcast_hook",  # DDP(mixed_precision=...)
        "BuiltinCommHookType.ALLREDUCE",
        "BuiltinCommHookType.FP16_COMPRESS",
    }
)


def replicas_of(dist: Any, owners: list[Any], ranks: list[int]) -> list[weakref.ref[Any]]:
    """The DDP modules holding every parameter of an optimizer (``owners``: the module
    that holds each, None for one no DDP holds), where each makes its gradients the same
    on every rank of ``ranks``; else none (the step is exchanged)."""
    ddp = getattr(sys.modules.get(_DDP[0]), _DDP[1], None)
    if not isinstance(ddp, type) or not owners:
        return []
    found: dict[int, Any] = {}
    for owner in owners:
        if owner is None or not issubclass(type(owner), ddp):
            return []
        found[id(owner)] = owner
    if not all(_plain(dist, ddp, owner, ranks) for owner in found.values()):
        return []
    return [weakref.ref(owner) for owner in found.values()]


def _plain(dist: Any, ddp: Any, owner: Any, ranks: list[int]) -> bool:
    """``owner`` (a DDP module) all-reduces every gradient over exactly ``ranks``, to the
    same values on each, and its forward says whether its next backward does."""
    try:
        group = owner.process_group
        if sorted(dist.get_process_group_ranks(group)) != sorted(ranks):
            return False
        if type(owner).forward is not ddp.forward or owner.parameters_to_ignore:
            return False
        if getattr(owner, "_use_python_reducer", False):  # its forward sets no flag
            return False
        if getattr(owner, "_delay_all_reduce_all_params", False):  # nor here
            return False
        hook = owner._get_ddp_logging_data().get("comm_hook")
    except Exception:  # a torch that keeps these otherwise: exchange
        return False
    return hook is None or hook in SAME_ON_EVERY_RANK


def synced(replicas: list[weakref.ref[Any]]) -> bool:
    """Each DDP module's last forward set up a synchronised backward (its gradients are
    the same on every rank after it)."""
    if not replicas:
        return False
    for ref in replicas:
        module = ref()
        if module is None or module.__dict__.get("require_forward_param_sync") is not True:
            return False
    return True
