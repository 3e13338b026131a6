"""grad_health across ranks: one decision per step for every rank that shares the
parameters, as torch's ``ShardedGradScaler``, fairscale's and DeepSpeed's overflow checks
make it.

Each rank checks the gradients its own optimizer consumes (the local shard under
``ZeroRedundancyOptimizer``, FSDP's flat-parameter shard, a DTensor's local tensor) and
the flags are all-reduced over the group that owns those parameters. A collective is
started only for an optimizer whose parameters are shared, by DDP, FSDP (1 and 2),
ZeRO or a DTensor mesh, whose ranks all step it: a purely local optimizer decides alone,
so an optimizer that only some ranks step never waits on the others.
"""

from __future__ import annotations

import sys

from autograd_guard.guards.grad_health.check import ALL_ZERO, SOME_VALUE, wrapper_modules
from autograd_guard.guards.grad_health.step import params_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Wrapper modules whose names are not the user's (FSDP1, activation checkpointing, compile)
WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
_FLAT = "_flat_param"


class Sharing:
    """How one optimizer's parameters are shared: the group that decides together and
    the parameters whose gradients this rank consumes."""

    __slots__ = ("first", "group", "ranks", "shard")

    def __init__(self, dist: Any, group: Any, shard: list[Any]) -> None:
        self.group = group
        self.shard = shard
        self.ranks: list[int] = list(dist.get_process_group_ranks(group))
        self.first = self.ranks[0] == dist.get_rank()  # logs the group's decisions

    def exchange(self, local: bool, device: Any, word: float) -> tuple[list[int], bool]:
        """All-reduce this rank's flag and its word on zero gradients (``zero``):
        the global ranks whose gradients were not finite, and whether every gradient of
        the group was exactly zero. Every rank of the group calls it at the same step,
        whatever it found."""
        torch = sys.modules["torch"]
        dist = torch.distributed
        n = len(self.ranks)
        flags = torch.zeros(2 * n, device=_flag_device(dist, self.group, device))
        me = dist.get_rank(self.group)
        flags[n + me] = word
        if local:
            flags[me] = 1.0
        dist.all_reduce(flags, group=self.group)
        values = flags.tolist()
        words = values[n:]
        all_zero = ALL_ZERO in words and SOME_VALUE not in words
        return [rank for rank, flag in zip(self.ranks, values, strict=False) if flag], all_zero

    def gather_names(self, names: list[str]) -> list[str]:
        """Every rank's names of its non-finite parameters (after ``exchange`` found some,
        so every rank of the group calls it)."""
        dist = sys.modules["torch"].distributed
        gathered: list[Any] = [None] * len(self.ranks)
        dist.all_gather_object(gathered, names, group=self.group)
        merged: list[str] = []
        for part in gathered:
            merged += [name for name in part or () if name not in merged]
        return merged


def sharing_of(optimizer: Any, params: list[Any]) -> Sharing | None:
    """How ``optimizer``'s parameters are shared across ranks; None when it decides alone
    (one process, or parameters no rank shares)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    if dist.get_world_size() < 2:
        return None
    zero = getattr(
        sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer"),
        "ZeroRedundancyOptimizer",
        None,
    )
    if zero is not None and isinstance(optimizer, zero):
        return Sharing(dist, optimizer.process_group, params_of(optimizer.optim))
    groups: list[Any] = []
    owners = _owners(dist)
    for param in params:
        group = _mesh_group(dist, param)
        if group is None:
            group = owners.get(id(param))
        if group is not None and not any(group is known for known in groups):
            groups.append(group)
    if not groups:
        return None
    return Sharing(dist, groups[0] if len(groups) == 1 else dist.group.WORLD, params)


def _owners(dist: Any) -> dict[int, Any]:
    """id(parameter) -> process group, for the parameters of live DDP and FSDP1 modules
    (one scan of live objects per optimizer, on its first step)."""
    import gc

    kinds = wrapper_modules()
    owners: dict[int, Any] = {}
    if not kinds:
        return owners
    # type(), never isinstance: a deprecated proxy's __class__ warns (reduce_op)
    found: list[Any] = [obj for obj in gc.get_objects() if issubclass(type(obj), kinds)]
    for obj in found:
        group = getattr(obj, "process_group", None) or dist.group.WORLD
        for param in obj.parameters():
            owners.setdefault(id(param), group)
    return owners


def _mesh_group(dist: Any, param: Any) -> Any:
    """The group of a DTensor parameter's mesh (FSDP2, tensor parallel)."""
    mesh = getattr(param, "device_mesh", None)
    if mesh is None or not hasattr(param, "to_local"):
        return None
    try:
        return mesh.get_group() if mesh.ndim == 1 else dist.group.WORLD
    except Exception:
        return dist.group.WORLD


def _flag_device(dist: Any, group: Any, device: Any) -> Any:
    """Where the group's backend takes the flags: the CPU for gloo, the device for NCCL."""
    torch = sys.modules["torch"]
    try:
        backend = str(dist.get_backend(group)).lower()
    except Exception:
        backend = "gloo"
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device if device is not None and "gloo" not in backend else torch.device("cpu")


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
