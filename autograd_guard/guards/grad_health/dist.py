"""grad_health across ranks: one decision per step for every rank that holds a part of the
same model, as Megatron-LM's ``found_inf`` (reduced over tensor x pipeline ranks),
DeepSpeed's pipeline overflow flag and torch's ``ShardedGradScaler`` make it.

Each rank checks the gradients its own optimizer consumes (the local shard under
``ZeroRedundancyOptimizer``, FSDP's flat-parameter shard, a DTensor's local tensor) and
the flags are summed over the model's ranks on the guard's own channel (``channel``). The
model's ranks are the union of the groups its parameters belong to: DDP's and FSDP1's
process group, ZeRO's, every rank of a DTensor's mesh (FSDP2, tensor parallel, 2-D DP x
TP), a ``torch.distributed.pipelining`` stage's group (every stage of one schedule, one
exchange per optimizer step, none per microbatch). A purely local optimizer decides alone,
so an optimizer that only some ranks step never waits on the others.
"""

from __future__ import annotations

import contextlib
import sys
import weakref

from autograd_guard._common.environment import rank
from autograd_guard.guards.grad_health.channel import ChannelClosed, channel_for
from autograd_guard.guards.grad_health.check import ALL_ZERO, SOME_VALUE, wrapper_modules
from autograd_guard.guards.grad_health.replicas import replicas_of
from autograd_guard.guards.grad_health.step import params_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from autograd_guard.guards.grad_health.channel import Channel
    from autograd_guard.guards.grad_health.replicas import Replicas

# Wrapper modules whose names are not the user's (FSDP1, activation checkpointing, compile)
WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
_FLAT = "_flat_param"
_STAGE = ("torch.distributed.pipelining.stage", "_PipelineStageBase")
_ZERO = ("torch.distributed.optim.zero_redundancy_optimizer", "ZeroRedundancyOptimizer")


class Sharing:
    """How one optimizer's parameters are shared: the ranks that decide together, the
    guard's channel between them and the parameters whose gradients this rank consumes."""

    __slots__ = ("channel", "first", "index", "joinables", "ranks", "replicas", "shard")

    def __init__(
        self,
        channel: Channel,
        shard: list[Any],
        index: int,
        joinables: list[Any] | None = None,
        replicas: Replicas | None = None,
    ) -> None:
        self.channel = channel
        self.joinables = [weakref.ref(j) for j in joinables or ()]  # DDP, ZeRO: ``Join``-able
        self.replicas = replicas  # plain DDP modules holding every parameter
        self.shard = shard
        self.ranks = channel.ranks
        self.first = channel.me == 0  # logs the group's decisions
        self.index = index  # the optimizer's place among those on this channel

    def exchange(
        self, local: bool, word: float, step: int, spoke: bool = True
    ) -> tuple[list[int], bool]:
        """Sum this rank's flag, its word on zero gradients and its step: the global
        ranks whose gradients were not finite, and whether every gradient of the group
        was exactly zero. ``spoke`` False: this rank left its step ``step`` with no word
        (``skips``); where no rank has a word, the ranks stay in step. ChannelClosed
        where the ranks cannot decide together."""
        torch = sys.modules["torch"]
        n, me = len(self.ranks), self.channel.me
        values = torch.zeros(3 * n, dtype=torch.float64)
        values[me], values[n + me] = float(local), word
        tag = float(step * 1024 + self.index % 1024)
        values[2 * n + me] = tag if spoke else -tag - 1
        summed = self.channel.all_reduce(values).tolist()
        tags = summed[2 * n :]
        if any(other != tags[me] for other in tags):
            raise self.channel.close(_out_of_step(self.ranks, tags))
        if not spoke:
            return [], False
        words = summed[n : 2 * n]
        all_zero = ALL_ZERO in words and SOME_VALUE not in words
        return [rank for rank, flag in zip(self.ranks, summed, strict=False) if flag], all_zero

    def plain(self) -> bool:
        """Plain DDP (``replicas``): its steps are never exchanged."""
        return self.replicas is not None and self.replicas.plain()

    def synced(self) -> bool:
        """Plain DDP's last forward with grad was synchronised: after its backward every
        rank holds the same gradients (where ``plain``)."""
        return self.replicas is not None and self.replicas.synced()

    def identical(self) -> bool:
        """Every rank holds the same gradients for this step: each decides alone, and
        each finds what the others find."""
        return self.plain() and self.synced()

    def release(self) -> None:
        """Its hooks go (the optimizer's record is dropped, or the guard detached)."""
        if self.replicas is not None:
            self.replicas.remove()

    def joining(self) -> bool:
        """A ``Join`` context (uneven inputs) is on for the model or its optimizer: a rank
        that ran out of inputs shadows the others' collectives, never the guard's."""
        for ref in self.joinables:
            config = getattr(ref(), "_join_config", None)
            if config is not None and getattr(config, "enable", False):
                return True
        return False

    def gather_names(self, names: list[str]) -> list[str]:
        """Every rank's names of its non-finite parameters (after ``exchange`` found some,
        so every rank of the group calls it); this rank's alone if the channel fails, or
        where every rank holds the same gradients."""
        if self.identical():
            return names
        try:
            gathered = self.channel.gather(names)
        except ChannelClosed:
            return names
        merged: list[str] = []
        for part in gathered:
            merged += [name for name in part or () if name not in merged]
        return merged


def _out_of_step(ranks: list[int], tags: list[float]) -> str:
    """Why the ranks cannot decide together: each rank's step, and its word."""
    said = [
        f"rank {rank} at its step {int(tag) // 1024}"
        if tag >= 0
        else f"rank {rank} began a forward pass before its step {int(-tag - 1) // 1024}'s check"
        for rank, tag in zip(ranks, tags, strict=True)
    ]
    why = (
        "a rank's step ended before the guard's check (an exception in a step pre-hook, "
        "say), or its own code skipped it after backward, while the others stepped"
        if any(tag < 0 for tag in tags)
        else "a rank skipped or repeated a step by its own code"
    )
    return f"the ranks were not at the same optimizer step ({', '.join(said)}): {why}"


def sharing_of(
    optimizer: Any,
    params: list[Any],
    timeout: float,
    count: int,
    plain: Callable[[Any], Any] | None = None,
) -> Sharing | None:
    """How ``optimizer``'s parameters are shared across ranks (None: one process, or no
    rank shares them). ``count``: the optimizers already sharing; ``plain``: plain DDP
    decides with no exchange (``replicas``), its forward hook kept eager by it."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    rank()  # remembered for the events written after destroy_process_group()
    if dist.get_world_size() < 2:
        return None
    zero = getattr(sys.modules.get(_ZERO[0]), _ZERO[1], None)
    shard = params
    found: list[frozenset[int]] = []
    groups: list[Any] = [None]  # the user's groups the model uses (None: the default one)
    joinables: list[Any] = []
    if zero is not None and isinstance(optimizer, zero):
        shard = params_of(optimizer.optim)
        found.append(frozenset(dist.get_process_group_ranks(optimizer.process_group)))
        groups.append(optimizer.process_group)
        joinables.append(optimizer)
    owners = _owners(dist)
    meshes: dict[int, Any] = {}
    held_by: list[Any] = []  # the module holding each parameter (None: a DTensor's mesh)
    for param in params:
        held = _mesh_ranks(param)
        owner = None
        if held is not None:
            meshes.setdefault(id(param.device_mesh), param.device_mesh)
        else:
            held, group, owner = owners.get(id(param), (None, None, None))
            if owner is not None and owner not in joinables:
                groups.append(group)
                joinables.append(owner)
        held_by.append(owner)
        if held is not None and held not in found:
            found.append(held)
    ranks = _model_ranks(dist, found)
    if len(ranks) < 2 or dist.get_rank() not in ranks:
        return None
    joining = [j for j in joinables if hasattr(j, "_join_config")]
    wait = _guard_wait(dist, timeout, groups, list(meshes.values()))
    channel = channel_for(dist, ranks, wait)  # first: the hooks below go with Sharing
    same = replicas_of(dist, held_by, ranks, plain) if plain and shard is params else None
    return Sharing(channel, shard, count, joining, same)


def _guard_wait(dist: Any, timeout: float, groups: list[Any], meshes: list[Any]) -> float:
    """The guard's wait: ``timeout``, at most half the shortest timeout of the user's
    ``groups`` and ``meshes``' groups (never the one that times out first)."""
    for mesh in meshes:
        with contextlib.suppress(Exception):  # a mesh without its groups: the default's
            groups = groups + list(mesh.get_all_groups())
    users = [t for t in (group_timeout(dist, g) for g in groups) if t is not None]
    return max(min(timeout, min(users) / 2), 0.5) if users else timeout


def group_timeout(dist: Any, group: Any) -> float | None:
    """A user's process group's timeout in seconds (None: the default group), where
    this torch says it."""
    torch = sys.modules["torch"]
    group = group or dist.distributed_c10d._get_default_group()
    for device in ("cpu", "cuda"):
        try:
            options = group._get_backend(torch.device(device)).options
            return float(options._timeout.total_seconds())
        except Exception:  # not this device's backend, or a torch without these
            continue
    return None


def _model_ranks(dist: Any, found: list[frozenset[int]]) -> list[int]:
    """The ranks of one model: the largest group found where it holds the others, else
    every rank."""
    if not found:
        return []
    largest = max(found, key=len)
    if all(ranks <= largest for ranks in found):
        return sorted(largest)
    return list(range(dist.get_world_size()))


def _owners(dist: Any) -> dict[int, tuple[frozenset[int], Any, Any]]:
    """id(parameter) -> the ranks of its group, that group and the object holding it,
    for the parameters of live DDP and FSDP1 modules and pipeline stages (one scan of
    live objects per optimizer, on its first step)."""
    import gc

    stage = getattr(sys.modules.get(_STAGE[0]), _STAGE[1], None)
    kinds = wrapper_modules() + ((stage,) if isinstance(stage, type) else ())
    owners: dict[int, tuple[frozenset[int], Any, Any]] = {}
    if not kinds:
        return owners
    # type(), never isinstance: a deprecated proxy's __class__ warns (reduce_op)
    found: list[Any] = [obj for obj in gc.get_objects() if issubclass(type(obj), kinds)]
    for obj in found:
        group = getattr(obj, "process_group", None) or getattr(obj, "group", None)
        ranks = frozenset(dist.get_process_group_ranks(group or dist.group.WORLD))
        module = obj.submod if stage is not None and isinstance(obj, stage) else obj
        for param in module.parameters():
            owners.setdefault(id(param), (ranks, group, obj))
    return owners


def _mesh_ranks(param: Any) -> frozenset[int] | None:
    """Every rank of a DTensor parameter's mesh (FSDP2, tensor parallel, 2-D meshes)."""
    mesh = getattr(param, "device_mesh", None)
    if mesh is None or not hasattr(param, "to_local"):
        return None
    return frozenset(int(rank) for rank in mesh.mesh.flatten().tolist())


def local_gradient(grad: Any) -> Any:
    """The values this rank holds of a gradient (a DTensor's local shard)."""
    to_local = getattr(grad, "to_local", None)
    return to_local() if to_local is not None else grad


def user_names(params: list[Any], names: list[str], grads: list[Any]) -> list[str]:
    """The user's names for non-finite parameters: wrapper modules' prefixes dropped, and
    an FSDP flat parameter's shard mapped to the original parameters it holds."""
    out: list[str] = []
    for param, name, grad in zip(params, names, grads, strict=True):
        for prefix in WRAPPER_PREFIXES:
            name = name.replace(prefix, "")
        if name == _FLAT or name.endswith("." + _FLAT):
            out += _flat_names(param, grad, name[: -len(_FLAT)])
        else:
            out.append(name)
    return out


def _flat_names(param: Any, grad: Any, prefix: str) -> list[str]:
    """The original parameters whose piece of this rank's flat shard is not finite."""
    fqns = getattr(param, "_fqns", None)
    infos = getattr(param, "_shard_param_infos", None)
    if not fqns or infos is None or grad is None:
        return [prefix + _FLAT]
    values = local_gradient(grad).detach().reshape(-1)
    found = []
    for fqn, info in zip(fqns, infos, strict=False):
        if not getattr(info, "in_shard", False):
            continue
        start, count = info.offset_in_shard, info.numel_in_shard
        piece = values[start : start + count]
        if not bool(piece.isfinite().all()):
            found.append(prefix + fqn)
    return found or [prefix + _FLAT]
