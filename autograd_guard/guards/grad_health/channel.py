"""grad_health's own channel between the ranks of one model: a gloo process group the
guard makes for itself, never one of the user's.

Symptom (of an exchange on the user's groups): the guard's flag all-reduce meets a user's
collective whenever the ranks are not in step at ``optimizer.step()``. A rank that catches
its own error around the step (the usual way to survive an OOM) goes on to its next
backward, whose DDP all-reduce pairs with the guard's on the other rank; a localiser or a
tensor-parallel check that communicates on one rank only does the same. gloo aborts both
ranks with a collective mismatch; NCCL hangs or corrupts. Any torch with
``torch.distributed``.

Remedy: the exchange runs on a ``ProcessGroupGloo`` built directly over a prefix of the
default store (one per set of ranks and default group, made at the group's first shared
step; a group made again after ``destroy_process_group()`` gets keys of its own, and the
old channel lets the destroyed group and its store go with it): it is not
registered with ``torch.distributed`` (the user's group names and counters are as
unguarded), and nothing else sends on it. Each rank's entry carries the optimizer's step
count, so ranks out of step (a rank that skipped or repeated a step by its own code) are
noticed. A channel that times out (``exchange_timeout``, at most half the shortest
timeout of the user's process groups that the model uses, the default one included: the
user's own collectives never time out behind the guard's wait), fails (a rank gone) or
finds the ranks out of step is closed for good: every later step decides on its own rank's
gradients, and the guard says so once. A rank that left a step without its word posts so
in the exchange (``skips``): the others do not wait for it.
"""

from __future__ import annotations

import json
import sys
import weakref
from datetime import timedelta

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_PREFIX = "autograd_guard/grad_health/"


class ChannelClosed(Exception):
    """The channel cannot decide together (any more): why, in words."""


class Channel:
    """The guard's gloo group over ``ranks`` (global ranks, in order)."""

    def __init__(
        self, dist: Any, ranks: list[int], timeout: float, generation: int, world: Any = None
    ) -> None:
        self.ranks = ranks
        self._world = weakref.ref(world) if world is not None else None  # the default group
        self.me = ranks.index(dist.get_rank())
        self.closed: str | None = None  # why it closed; said once
        self.said = False
        self.timeout = timedelta(seconds=timeout)
        self._dist = dist
        self._group: Any = None
        # the store outlives a destroyed group (torchrun's agent store): the keys of each
        # default group's channel over these ranks are its own
        self._prefix = f"{_PREFIX}{'_'.join(map(str, ranks))}/{generation}/"

    def _pg(self) -> Any:
        if self._group is None:
            dist = self._dist
            store = dist.PrefixStore(self._prefix, dist.distributed_c10d._get_default_store())
            self._group = dist.ProcessGroupGloo(store, self.me, len(self.ranks), self.timeout)
        return self._group

    def all_reduce(self, values: Any) -> Any:
        """``values`` summed over the ranks (a CPU float64 tensor), or ChannelClosed."""
        if self.closed is not None:
            raise ChannelClosed(self.closed)
        if self._world is not None and not self._current():
            self.release()  # destroy_process_group(): a rank may go on alone, as unguarded
            raise ChannelClosed(self.closed)
        try:
            options = self._dist.AllreduceOptions()
            options.timeout = self.timeout  # a later optimizer's groups may be shorter
            self._pg().allreduce([values], options).wait()
        except Exception as exc:  # a timeout, a rank gone: never again on this channel
            raise self.close(
                f"the guard's exchange with ranks {', '.join(map(str, self.ranks))} failed "
                f"({_reason(exc)}): a rank skipped or repeated a step by its own code, or is "
                "gone"
            ) from None
        return values

    def _current(self) -> bool:
        """The default group it was made over is still the default group."""
        dist = self._dist
        try:
            world = dist.distributed_c10d._get_default_group() if dist.is_initialized() else None
        except Exception:  # no default group any more
            world = None
        return world is not None and self._world is not None and world is self._world()

    def release(self) -> None:
        """The default group it ran over was destroyed: its gloo group (sockets, and the
        store with its port) is let go, and it decides no more (nothing said: the ranks
        were told to part, by the user's own code)."""
        self._group = None
        if self.closed is None:
            self.closed = "the process group of the guard's exchange was destroyed"
            self.said = True

    def close(self, why: str) -> ChannelClosed:
        self.closed = why
        return ChannelClosed(why)

    def gather(self, value: object) -> list[Any]:
        """Every rank's ``value`` (JSON), in rank order; ChannelClosed on failure."""
        torch = sys.modules["torch"]
        data = json.dumps(value).encode()
        n = len(self.ranks)
        sizes = torch.zeros(n, dtype=torch.float64)
        sizes[self.me] = len(data)
        longest = int(self.all_reduce(sizes).max().item())
        mine = torch.zeros(n * longest, dtype=torch.float64)
        start = self.me * longest
        mine[start : start + len(data)] = torch.tensor(list(data), dtype=torch.float64)
        values = self.all_reduce(mine).to(torch.uint8).tolist()
        return [
            json.loads(bytes(values[r * longest : r * longest + int(sizes[r].item())]))
            for r in range(n)
        ]


def _reason(exc: Exception) -> str:
    """gloo's first line, without its source file: ``Timed out waiting 3000ms for recv
    operation to complete``, ``Connection closed by peer [127.0.0.1]:4999``."""
    text = (str(exc).splitlines() or [""])[0]
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text.split(". ")[0][:160] or type(exc).__name__


_CHANNELS: dict[tuple[int, ...], tuple[Any, Channel]] = {}  # (weakref to world, channel)
_GENERATIONS: dict[tuple[int, ...], int] = {}  # channels made over these ranks, less one


def channel_for(dist: Any, ranks: list[int], timeout: float) -> Channel:
    """The channel over ``ranks``: one per set of ranks and default group. It holds the
    default group weakly and is released with it (``destroy_process_group()``, then the
    user's last reference gone): a group made again gets a new channel, and a re-init
    finds the old group's store and port free, as unguarded."""
    key = tuple(ranks)
    world = dist.distributed_c10d._get_default_group()
    known = _CHANNELS.get(key)
    if known is not None and known[0]() is world:
        channel = known[1]
        channel.timeout = min(channel.timeout, timedelta(seconds=timeout))
        return channel
    generation = _GENERATIONS[key] = _GENERATIONS.get(key, -1) + 1
    channel = Channel(dist, list(ranks), timeout, generation, world)
    _CHANNELS[key] = (weakref.ref(world), channel)
    weakref.finalize(world, _release, key, channel)
    return channel


def _release(key: tuple[int, ...], channel: Channel) -> None:
    channel.release()
    if _CHANNELS.get(key, (None, None))[1] is channel:
        del _CHANNELS[key]
