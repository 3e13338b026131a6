"""The shared half of grad_health's step logic: a step whose optimizer's parameters are
shared by the ranks of one model is decided together, on the guard's own channel
(``dist``, ``channel``), or alone once the ranks cannot decide together; where every
rank holds the same gradients (plain DDP, ``replicas``), each rank's verdict is theirs,
with nothing exchanged. A step that ends on this rank without its word (skipped by the
loop, a pre-hook that raised) is posted at the model's next forward (``skips``); inside
a ``Join`` context (uneven inputs) the ranks decide alone from then on (a rank out of
inputs shadows only the model's collectives).
"""

from __future__ import annotations

import contextlib

from autograd_guard.errors import GuardError
from autograd_guard.guards.grad_health import skips, zero
from autograd_guard.guards.grad_health.channel import ChannelClosed
from autograd_guard.guards.grad_health.check import ALL_ZERO, NO_GRADIENTS, SOME_VALUE
from autograd_guard.guards.grad_health.dist import local_gradient, sharing_of
from autograd_guard.guards.grad_health.gate import RUN

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from autograd_guard.guards.grad_health.check import FiniteCheck
    from autograd_guard.guards.grad_health.closure import Evaluation
    from autograd_guard.guards.grad_health.compile import EagerHooks
    from autograd_guard.guards.grad_health.dist import Sharing
    from autograd_guard.guards.grad_health.nonfinite import NonFinite
    from autograd_guard.guards.grad_health.record import Record, Records
    from autograd_guard.guards.grad_health.voice import Voice
    from autograd_guard.guards.grad_health.words import StepSites
    from autograd_guard.guards.grad_health.zero import ZeroWatch


class Together:
    """Deciding a step with the other ranks of the model; which ranks those are is found
    once per set of parameters (``sharing``, kept in the optimizer's ``Record``)."""

    def __init__(
        self,
        voice: Voice,
        sites: StepSites,
        finite: FiniteCheck,
        zero: ZeroWatch,
        nonfinite: NonFinite,
        hooks: EagerHooks,
    ) -> None:
        self._voice, self._sites, self._finite = voice, sites, finite
        self._zero, self._nonfinite, self._hooks = zero, nonfinite, hooks

    def decide(
        self,
        optimizer: Any,
        record: Record,
        consumed: list[Any],
        grads: list[Any],
        sharing: Sharing,
        gated: bool,
        evaluation: Evaluation | None,
    ) -> object:
        """Every rank of the group enters the exchange, whatever it found; where the
        ranks cannot decide together, this rank decides on its own gradients."""
        local, word = False, NO_GRADIENTS
        try:
            if grads:
                values = [local_gradient(g) for g in grads]
                flag = self._zero.probe_for(record, values)
                local = not self._finite.all_finite(values, None, flag)
                all_zero = not local and zero.all_zero(record, values, flag)
                if local or any(v.numel() for v in values):  # a shard of empty ones says nothing
                    word = ALL_ZERO if all_zero else SOME_VALUE
        except Exception as exc:  # the exchange still happens: no rank is left waiting
            self._voice.fail("step check", exc)
        skips.spoke(record)
        try:
            if sharing.plain():  # plain DDP (in a Join too): nothing exchanged
                if not sharing.synced():  # after no_sync(): this rank's own gradients
                    return self._own(optimizer, record, consumed, (local, word), gated, evaluation)
                ranks, all_zero = (list(sharing.ranks) if local else []), word == ALL_ZERO
            elif sharing.joining():
                raise sharing.channel.close(JOINING)
            else:
                ranks, all_zero = sharing.exchange(local, word, record.step)
        except ChannelClosed as closed:
            self._alone(optimizer, sharing, str(closed))
            return self._own(optimizer, record, consumed, (local, word), gated, evaluation)
        if not ranks:
            record.in_a_row = 0
            self._zero.counted(optimizer, record, all_zero, sharing)
            return RUN
        bad = [p for p in consumed if p.grad is not None] if local else []
        return self._nonfinite.verdict(
            optimizer, record, bad, gated=gated, sharing=sharing, ranks=ranks, evaluation=evaluation
        )

    def _own(
        self,
        optimizer: Any,
        record: Record,
        consumed: list[Any],
        found: tuple[bool, float],
        gated: bool,
        evaluation: Evaluation | None,
    ) -> object:
        """This rank's verdict on its own gradients (``found``: whether they were not
        finite, its word on zero gradients), said by itself."""
        local, word = found
        if not local:
            record.in_a_row = 0  # a finite step ends a stall
            self._zero.counted(optimizer, record, word == ALL_ZERO)
            return RUN
        bad = [p for p in consumed if p.grad is not None]
        return self._nonfinite.verdict(optimizer, record, bad, gated=gated, evaluation=evaluation)

    def _alone(self, optimizer: Any, sharing: Sharing, why: str) -> None:
        """The ranks cannot decide together any more: said once per channel, by each rank."""
        channel = sharing.channel
        if channel.said:
            return
        channel.said = True
        joining = why == JOINING
        self._voice.emit(
            f"{why}; from now on each rank of {', '.join(map(str, channel.ranks))} decides "
            "its optimizer steps on its own gradients (a non-finite gradient on one rank "
            "skips that rank's step alone)",
            action="ranks_out_of_step",
            callsite=self._sites.site(optimizer),
            level="info" if joining else "warning",
            ranks=channel.ranks,
            remedy="nothing to do (DDP's gradients are the same on every rank; a "
            "ZeroRedundancyOptimizer's shards decide each alone)"
            if joining
            else "step every rank of the model at every step (skip a batch on all ranks "
            "together, e.g. by all-reducing the reason first), or raise on every rank",
        )

    def sharing(
        self, optimizer: Any, record: Record, params: list[Any], records: Records
    ) -> Sharing | None:
        if record.shared_known != len(params):  # the first step, or add_param_group
            record.shared_known = len(params)
            count = sum(1 for other in records.all() if other.sharing is not None)
            config = self._voice.config
            before = record.sharing  # add_param_group: found again
            plain = None if config["exchange_ddp"] else self._hooks.eager
            record.sharing = sharing = sharing_of(
                optimizer, params, config["exchange_timeout"], count, plain
            )
            if before is not None:
                before.release()
            if sharing is not None and self._voice.mode != "observe":  # observe never waits
                try:
                    skips.watch(optimizer, record, params, self._skipped, self._hooks.eager)
                except Exception as exc:  # a step left goes untold: the guard's timeout
                    self._voice.fail("step check", exc)
        return record.sharing  # one whose channel closed still says what this rank consumes

    def _skipped(self, optimizer: Any, record: Record, step: int) -> None:
        """A backward of the model ran since this rank's last word, and a forward begins
        (``skips``; not one inside the optimizer's own step): this rank left
        its step with no word, and the others, in that step's exchange, hear so at once.
        Never raises (the forward goes on)."""
        sharing = record.sharing
        try:
            if sharing is None or sharing.channel.closed is not None:
                return
            if sharing.plain():  # plain DDP: no rank waits in an exchange
                return
            try:
                sharing.exchange(False, NO_GRADIENTS, step, spoke=False)
            except ChannelClosed as closed:
                self._alone(optimizer, sharing, str(closed))
        except Exception as exc:
            with contextlib.suppress(GuardError):  # strict: the user's forward goes on
                self._voice.fail("step exit", exc)


JOINING = (
    "the model's ranks are in a Join context (uneven inputs): a rank out of inputs shadows "
    "the model's collectives, never the guard's exchange"
)
