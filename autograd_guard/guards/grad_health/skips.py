"""A shared optimizer step that ends on one rank without the guard's word reaches the
other ranks: the rank's next forward pass of the model posts "no step here" on the guard's
channel before the model can run a collective of its own.

Symptom (the guard's own wait): ``loss.backward(); if bad: continue`` on one rank only,
with DDP; or a step whose pre-hook raises on one rank (an OOM guard, a "skip this batch"
hook) and a loop that catches it. Unguarded, both ranks finish: DDP's all-reduce is in
the backward, and the rank that skipped simply did not step. Guarded, the other ranks
wait in the guard's exchange of that step while the skipping rank is in its next forward
and backward, whose collectives (DDP's buffer broadcast and all-reduce, FSDP2's
all-gather, a tensor-parallel layer's all-reduce) wait on them: both sit there until a
timeout, and gloo's ends the job. No guard code runs in between on the skipping rank but
in the model's next forward. Any torch with ``torch.distributed``.

Remedy: once an optimizer is known to decide together with other ranks (its first
shared step; not in ``observe``), the modules at the top of its model (found once among
live modules: those holding its parameters that no other module holds; DDP's and FSDP's
wrappers, a ``torch.compile`` wrapper) get a forward pre-hook put before any other (before
FSDP2's all-gather and DDP's own forward) and a forward hook. The forward hook, where
autograd records, hooks the output's gradient: the backward of this forward began. A
forward that finds a backward begun since the optimizer's last word (its exchange) is a
step this rank left without a word (skipped by its loop, a pre-hook that raised, a guard
check that failed open before the exchange): it posts "no step here" for that step, so
ranks waiting in that step's exchange decide at once, each alone from then on
(``ranks_out_of_step``, said once with each rank's step); ranks that all accumulate (two
forward and backward passes per step on every rank) each post it and stay in step, one
small exchange per extra pass.

A ``torch.distributed.pipelining`` stage receives the activations before its module
runs: there the check runs where the schedule's ``step`` begins (it clears the stage's
state first, ``clear_runtime_states``; an instance attribute of the stage, undone with
the hooks). Not covered: a step left so at the optimizer's very first step (the hooks
come at the first shared step's check), a model whose top module is never called (its
parts called one by one), and a pipeline on a torch whose stages lack
``clear_runtime_states``: there the ranks decide at the guard's timeout, at most half
the shortest timeout of the process groups the model uses (``channel``). None of this
waits with plain DDP, which exchanges nothing (``replicas``): a step it decides so posts
nothing.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import weakref

_STAGE = ("torch.distributed.pipelining.stage", "_PipelineStageBase")
_CLEAR = "clear_runtime_states"

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from autograd_guard.guards.grad_health.record import Record

    # post(optimizer, record, step): this rank posts "no word here" for its step ``step``
    Post = Callable[[Any, "Record", int], None]


class SkipWatch:
    """The hooks on one optimizer's top modules; ``backward``: a backward of its model
    began since the optimizer's last word."""

    __slots__ = (
        "__weakref__",
        "_optimizer",
        "_post",
        "_record",
        "backward",
        "handles",
        "spoken",
    )

    def __init__(self, optimizer: Any, record: Record, post: Post) -> None:
        self._optimizer = weakref.ref(optimizer)
        self._record = weakref.ref(record)
        self._post = post
        self.backward = False
        self.spoken = record.step  # the optimizer's step of its last word
        self.handles: list[Any] = []

    def hook(self, roots: list[Any], eager: Callable[[Any], Any]) -> None:
        for root in roots:
            self.handles.append(root.register_forward_pre_hook(eager(self._forward), prepend=True))
            self.handles.append(root.register_forward_hook(eager(self._forwarded)))

    def hook_stage(self, stage: Any) -> None:
        """A pipeline stage: its schedule's ``step`` clears the stage's state first, before
        it receives anything (``clear_runtime_states``, where this torch has it)."""
        clear = getattr(stage, _CLEAR, None)
        if clear is None or _CLEAR in vars(stage):
            return
        forward = self._forward

        def clear_runtime_states(*args: Any, **kwargs: Any) -> Any:
            forward(stage, ())
            return clear(*args, **kwargs)

        setattr(stage, _CLEAR, clear_runtime_states)
        self.handles.append(_Restore(stage, clear_runtime_states))

    def _forward(self, module: Any, args: Any) -> None:
        if not self.backward or not sys.modules["torch"].is_grad_enabled():
            return
        self.backward = False
        optimizer, record = self._optimizer(), self._record()
        if record is not None and record.depth:  # in the optimizer's own step (a closure)
            return
        if optimizer is not None and record is not None and self._open(record):
            # the step left: the next one (a skip, a pre-hook that raised), or the one
            # counted but never exchanged (a check that failed open before it)
            step = record.step + 1 if self.spoken >= record.step else record.step
            self.spoken = step
            self._post(optimizer, record, step)

    def _forwarded(self, module: Any, args: Any, output: Any) -> None:
        torch = sys.modules["torch"]
        if not torch.is_grad_enabled():
            return
        if not self._open(self._record()):
            return
        tensor = _first_tensor(output, torch.Tensor)
        if tensor is not None and tensor.requires_grad:
            with contextlib.suppress(Exception):  # the forward goes on, this pass unwatched
                tensor.register_hook(self._began)

    def _began(self, grad: Any) -> None:
        self.backward = True  # the gradient is left as it is

    def _open(self, record: Record | None) -> bool:
        """The optimizer lives and its channel still decides together; else the hooks go."""
        sharing = record.sharing if record is not None else None
        if sharing is not None and sharing.channel.closed is None:
            return True
        self.remove()
        return False

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


class _Restore:
    """Undoes ``hook_stage`` (as a hook's handle does), unless something replaced it."""

    __slots__ = ("_ours", "_stage")

    def __init__(self, stage: Any, ours: Any) -> None:
        self._stage, self._ours = weakref.ref(stage), ours

    def remove(self) -> None:
        stage = self._stage()
        if stage is not None and vars(stage).get(_CLEAR) is self._ours:
            delattr(stage, _CLEAR)


def _first_tensor(output: Any, tensor: type) -> Any:
    """The first tensor of a forward's output (a tensor, a sequence or a mapping of them)."""
    if isinstance(output, tensor):
        return output
    values = output.values() if isinstance(output, dict) else output
    if isinstance(values, (list, tuple)) or isinstance(output, dict):
        for value in values:
            if isinstance(value, tensor):
                return value
    return None


def watch(
    optimizer: Any, record: Record, params: list[Any], post: Post, eager: Callable[[Any], Any]
) -> None:
    """Hook the top modules of ``optimizer``'s model (once per optimizer)."""
    if record.skips is not None:
        return
    skips = SkipWatch(optimizer, record, post)
    roots = top_modules(params)
    skips.hook(roots, eager)
    stage = getattr(sys.modules.get(_STAGE[0]), _STAGE[1], None)
    if isinstance(stage, type):
        ids = {id(root) for root in roots}
        for obj in gc.get_objects():
            if issubclass(type(obj), stage) and id(getattr(obj, "submod", None)) in ids:
                skips.hook_stage(obj)
    record.skips = skips


def top_modules(params: list[Any]) -> list[Any]:
    """The live modules holding some of ``params`` that no other live module holds."""
    module = sys.modules["torch"].nn.Module
    # type(), never isinstance: a deprecated proxy's __class__ warns (reduce_op)
    modules = [obj for obj in gc.get_objects() if issubclass(type(obj), module)]
    children = {id(child) for m in modules for child in m._modules.values() if child is not None}
    wanted = {id(p) for p in params}
    return [
        m for m in modules if id(m) not in children and any(id(p) in wanted for p in m.parameters())
    ]


def spoke(record: Record) -> None:
    """The optimizer's step gave its word (its exchange): a backward from here on is
    the next step's."""
    if record.skips is not None:
        record.skips.backward = False
        record.skips.spoken = record.step


def began(record: Record) -> None:
    """The optimizer's step began (its backward done): until its word, a forward of the
    model is a step this rank left."""
    if record.skips is not None:
        record.skips.backward = True


def remove(record: Record) -> None:
    skips, record.skips = record.skips, None
    if skips is not None:
        skips.remove()
