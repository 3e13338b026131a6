"""Clones of the inference tensors among a stage's arguments, for ``grad_mode``: autograd
cannot save an inference tensor, so a stage that needs grad gets a clone.

Only a list, tuple or dict that holds such a tensor is copied (of its own type); every
other argument is passed as the caller's own object. After the call, what the stage wrote
goes back to the caller: writes into a clone into the caller's tensor, and items the
stage set, added or removed in a copied list or dict into the caller's list or dict.
"""

from __future__ import annotations

import copy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEPTH = 2  # container levels searched inside each argument


class InferenceClones:
    def __init__(self, torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._torch = torch
        self._args, self._kwargs = args, kwargs
        self.found = sum(_count(torch.Tensor, v, DEPTH) for v in (*args, *kwargs.values()))
        self.written: list[Any] = []  # the caller's tensors that the stage wrote into
        self._tensors: list[tuple[Any, Any, int]] = []  # original, clone, clone's version
        self._containers: list[tuple[Any, Any]] = []  # the caller's container, its copy
        self._originals: dict[int, Any] = {}  # id of a clone or copy -> the caller's object
        self._copies: dict[int, Any] = {}  # id of the caller's tensor or container -> copy

    def prepare(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments to pass (call under ``inference_mode(False)``)."""
        if not self.found:
            return self._args, self._kwargs
        args = tuple(self._rebuild(v, DEPTH) for v in self._args)
        kwargs = {k: self._rebuild(v, DEPTH) for k, v in self._kwargs.items()}
        return args, kwargs

    def copy_back(self) -> None:
        """Put what the stage wrote into the caller's tensors and containers."""
        self.written = [o for o, c, version in self._tensors if c._version != version]
        if self.written:
            with self._torch.inference_mode():
                for original in self.written:
                    original.copy_(self._copies[id(original)])
        for original, mine in self._containers:
            if isinstance(original, list):
                items = [self._caller_object(v) for v in mine]
                if len(items) != len(original) or any(map(_not_same, items, original)):
                    original[:] = items
            elif isinstance(original, dict):
                _sync(original, {k: self._caller_object(v) for k, v in mine.items()})

    def _caller_object(self, value: Any) -> Any:
        return self._originals.get(id(value), value)

    def _rebuild(self, value: Any, depth: int) -> Any:
        if id(value) in self._copies:  # passed twice: one copy, written back once
            return self._copies[id(value)]
        if isinstance(value, self._torch.Tensor):
            if not value.is_inference():
                return value
            clone = self._copies[id(value)] = value.clone()
            self._tensors.append((value, clone, clone._version))
            self._originals[id(clone)] = value
            return clone
        if depth <= 0 or not _count(self._torch.Tensor, value, depth):
            return value  # holds no inference tensor: the caller's own object
        mine: Any
        if isinstance(value, dict):
            mine = copy.copy(value)  # of the caller's own type (OrderedDict, defaultdict)
            for key, item in value.items():
                mine[key] = self._rebuild(item, depth - 1)
        elif isinstance(value, list):
            mine = copy.copy(value)
            mine[:] = [self._rebuild(item, depth - 1) for item in value]
        elif type(value) is tuple or hasattr(value, "_make"):  # a tuple, a namedtuple
            items = [self._rebuild(item, depth - 1) for item in value]
            return tuple(items) if type(value) is tuple else value._make(items)
        else:
            return value
        self._containers.append((value, mine))
        self._originals[id(mine)] = value
        self._copies[id(value)] = mine
        return mine


def _count(tensor: Any, value: Any, depth: int) -> int:
    """The inference tensors in ``value`` and its lists, tuples and dicts."""
    if isinstance(value, tensor):
        return int(value.is_inference())
    if depth <= 0:
        return 0
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (list, tuple)):
        return 0
    return sum(_count(tensor, item, depth - 1) for item in value)


def _not_same(a: Any, b: Any) -> bool:
    return a is not b


def _sync(original: dict[Any, Any], items: dict[Any, Any]) -> None:
    """Make ``original`` hold ``items``, touching only the keys that differ."""
    for key in [k for k in original if k not in items]:
        del original[key]
    for key, value in items.items():
        if key not in original or original[key] is not value:
            original[key] = value
