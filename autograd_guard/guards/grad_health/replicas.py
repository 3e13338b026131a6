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
- its communication hook keeps the reduced gradient the same on every rank, over DDP's
  own group: none, torch's all-reduce, fp16 or bf16 compression, PowerSGD, DDP's
  mixed-precision upcast (not post-local SGD, which reduces within subgroups, one of
  those given another group as its state, nor a hook the guard does not know; where
  torch does not say a hook's state, torch 2.1, only none, the built-in ones and the
  upcast); a hook registered later is read at the next step;
- its last forward pass with grad enabled ran outside ``no_sync()`` (a forward hook of
  the guard's: a forward without grad, on one rank alone, say, changes nothing; until
  the first one seen, the ``no_sync()`` flag at the first shared step, so a first step
  taken after its ``no_sync()`` block is read as synchronised: its events may name every
  rank), on a DDP that all-reduces in its backward (not the Python reducer of compiled
  autograd, nor ``delay_all_reduce_named_params`` covering every parameter).

A step right after a ``no_sync()`` backward (local SGD, a step inside gradient
accumulation) holds each rank's own gradients: each rank decides it alone and says so
itself, with nothing exchanged either (strict raises on that rank alone, as for a
rank's local optimizer); so does a step whose DDP module is gone (the model wrapped
again: ranks free the old one at different times). So a plain DDP model never
exchanges, and the skip watch never posts for it (accumulating micro-batches cost no
exchange). Anything else exchanges as before: ZeRO, FSDP, DTensor, pipelining, a local
parameter beside DDP's, an unknown hook. The conditions are read from what every rank of
a job DDP can run does alike (the same model, hooks, ``no_sync()`` and forward passes
with grad: DDP needs them), so the ranks choose alike; a forward without grad, which may
run on one rank alone, is not read.
Not covered: a parameter frozen when DDP was made and unfrozen later (DDP never
all-reduces it, outside DDP's contract).
"""

from __future__ import annotations

import sys
import weakref

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_DDP = ("torch.nn.parallel.distributed", "DistributedDataParallel")
_TORCHS_HOOKS = "torch.distributed.algorithms.ddp_comm_hooks."
# communication hooks whose reduced gradient is the same on every rank, as DDP's logging
# data names them (a wrapper of another hook is not among them: its inner hook may not
# be): torch's that reduce over the group given as their state (None: DDP's), and those
# that always reduce over DDP's group
STATEFUL = frozenset(
    {
        "allreduce_hook",
        "fp16_compress_hook",
        "bf16_compress_hook",
        "powerSGD_hook",
        "batched_powerSGD_hook",
    }
)
OVER_DDPS_GROUP = frozenset(
    {
        "_reducer_allreduce_and_upcast_hook",  # DDP(mixed_precision=...)
        "BuiltinCommHookType.ALLREDUCE",
        "BuiltinCommHookType.FP16_COMPRESS",
    }
)
SAME_ON_EVERY_RANK = STATEFUL | OVER_DDPS_GROUP


def replicas_of(
    dist: Any, owners: list[Any], ranks: list[int], eager: Callable[[Any], Any]
) -> Replicas | None:
    """The DDP modules holding every parameter of an optimizer (``owners``: the module
    that holds each, None for one no DDP holds), where each makes its gradients the same
    on every rank of ``ranks``; else None (the step is exchanged)."""
    ddp = getattr(sys.modules.get(_DDP[0]), _DDP[1], None)
    if not isinstance(ddp, type) or not owners:
        return None
    found: dict[int, Any] = {}
    for owner in owners:
        if owner is None or not issubclass(type(owner), ddp):
            return None
        found[id(owner)] = owner
    if not all(_plain(dist, ddp, owner, ranks) for owner in found.values()):
        return None
    return Replicas(dist, ddp, list(found.values()), ranks, eager)


class Replicas:
    """Plain DDP modules (``replicas_of``), whether each one's last forward pass with
    grad enabled set up a synchronised backward, and the hooks each had when read."""

    __slots__ = ("_check", "_handles", "_hooks", "_modules", "_off", "_synced")

    def __init__(
        self,
        dist: Any,
        ddp: Any,
        modules: list[Any],
        ranks: list[int],
        eager: Callable[[Any], Any],
    ) -> None:
        self._modules = [weakref.ref(module) for module in modules]
        self._off = False  # a hook registered since may leave the gradients apart
        # until a forward is seen: the no_sync() flag at the first shared step
        self._synced = {id(m): m.require_backward_grad_sync is True for m in modules}
        self._hooks = {id(m): _hooks_of(m) for m in modules}
        self._check: Callable[[Any], bool] = lambda module: _plain(dist, ddp, module, ranks)
        self._handles = [m.register_forward_hook(eager(self._forwarded)) for m in modules]

    def _forwarded(self, module: Any, args: Any, output: Any) -> None:
        if sys.modules["torch"].is_grad_enabled():  # one without grad sets up no backward
            self._synced[id(module)] = module.require_backward_grad_sync is True

    def plain(self) -> bool:
        """No hook registered since may leave the ranks' reduced gradients apart (one that
        may makes every later step exchanged, on every rank at the same step). A module
        gone changes nothing here: ranks free it at different times (``synced``)."""
        if self._off:
            return False
        for ref in self._modules:
            module = ref()
            if module is None:
                continue
            hooks = _hooks_of(module)
            if hooks != self._hooks[id(module)]:
                if not self._check(module):
                    self._off = True
                    return False
                self._hooks[id(module)] = hooks
        return True

    def synced(self) -> bool:
        """Each module's last forward pass with grad ran outside ``no_sync()``: after its
        backward every rank holds the same gradients (where ``plain``). A module gone
        (the model wrapped again): each rank's gradients are taken as its own."""
        for ref in self._modules:
            module = ref()
            if module is None or not self._synced.get(id(module)):
                return False
        return bool(self._modules)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._modules = [], []


def _plain(dist: Any, ddp: Any, owner: Any, ranks: list[int]) -> bool:
    """``owner`` (a DDP module) all-reduces every gradient over exactly ``ranks``, to the
    same values on each, in its backward."""
    try:
        if _ranks(dist, owner.process_group) != sorted(ranks):
            return False
        if type(owner).forward is not ddp.forward or owner.parameters_to_ignore:
            return False
        if getattr(owner, "_use_python_reducer", False):  # its own reducer, in Python
            return False
        if getattr(owner, "_delay_all_reduce_all_params", False):  # after the backward
            return False
        return _hooks_keep_same(dist, owner, ranks)
    except Exception:  # a torch that keeps these otherwise: exchange
        return False


def _hooks_keep_same(dist: Any, owner: Any, ranks: list[int]) -> bool:
    """Each communication hook of ``owner`` leaves the gradient the same on every rank of
    ``ranks``: a known one over DDP's group (its state None, that group or one over the
    same ranks)."""
    name = owner._get_ddp_logging_data().get("comm_hook")
    hooks = getattr(owner, "_comm_hooks", None)
    if hooks is None:  # torch 2.1: the state is not kept, so not read
        return name is None or name in OVER_DDPS_GROUP
    for hook, state in hooks:
        if getattr(hook, "__qualname__", None) not in SAME_ON_EVERY_RANK:
            return False
        if not str(getattr(hook, "__module__", "")).startswith(_TORCHS_HOOKS):
            return False  # a function of the user's by the same name
        group = getattr(state, "process_group", state)
        if hasattr(group, "rank") and _ranks(dist, group) != sorted(ranks):
            return False
    return name is None or name in SAME_ON_EVERY_RANK


def _hooks_of(module: Any) -> object:
    """What shows a hook registered since: their number, or (torch 2.1) the name DDP
    logs."""
    hooks = getattr(module, "_comm_hooks", None)
    if hooks is not None:
        return len(hooks)
    return module._get_ddp_logging_data().get("comm_hook")


def _ranks(dist: Any, group: Any) -> list[int]:
    return sorted(dist.get_process_group_ranks(group))
