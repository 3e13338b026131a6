"""What a guard is handed: the ``Target`` it wraps, the ``Call`` in progress, and the
helpers guards read arguments with. A leaf of the engine: the wrapper and the guard
contract both build on it."""

from __future__ import annotations

from autograd_guard._common.callsite import find_callsite

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any

    # A guard's cheap test of a call: (instance, args, kwargs) -> risky or not.
    Check = Callable[[Any, tuple[Any, ...], dict[str, Any]], bool]


class Target:
    """A callable to wrap: ``module`` defines ``qualname``; ``aliases`` re-export it.

    With ``after``, nothing happens until that module is imported too (a guard for a
    library that changes another library's behaviour, such as IPEX and torch). A guard
    with several remedies names the methods of this target's own: ``check`` (in place of
    ``risky``), ``handle`` and ``traced`` (in place of ``_traced``).

    For a hot path, ``switch`` names a list the guard holds (made in its ``__init__``):
    while it is empty, the wrapper does not run at all and the call goes straight to the
    library (wrapt's ``enabled``: a list's truth costs no Python call).
    """

    __slots__ = (
        "after",
        "aliases",
        "check",
        "handle",
        "module",
        "qualname",
        "rule",
        "skip",
        "switch",
        "traced",
    )

    def __init__(
        self,
        module: str,
        qualname: str,
        aliases: Iterable[str] = (),
        after: str | None = None,
        skip: Iterable[str] = (),
        rule: str | None = None,
        check: str | None = None,
        handle: str | None = None,
        traced: str | None = None,
        switch: str | None = None,
    ) -> None:
        self.module = module
        self.qualname = qualname
        self.aliases = tuple(aliases)
        self.after = after
        self.skip = tuple(skip)  # more packages whose frames are not the call site
        self.rule = rule  # "policy.toml: rules[2]" for a target that a policy rule names
        self.check, self.handle, self.traced = check, handle, traced  # method names
        self.switch = switch  # an attribute's name

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}"

    def __repr__(self) -> str:
        return f"Target({str(self)!r})"


def argument(
    args: tuple[Any, ...], kwargs: dict[str, Any], name: str, position: int, default: Any = None
) -> Any:
    """An argument passed by keyword ``name`` or at ``position`` (the one way to read one,
    as dd-trace's ``get_argument_value``)."""
    if name in kwargs:
        return kwargs[name]
    if 0 <= position < len(args):
        return args[position]
    return default


def iter_tensors(value: Any, tensor: type, depth: int = 3) -> Iterator[Any]:
    """The tensors in ``value`` and in its lists, tuples and dicts, ``depth`` levels down."""
    if isinstance(value, tensor):
        yield value
    elif depth > 0 and isinstance(value, (list, tuple)):
        for item in value:
            yield from iter_tensors(item, tensor, depth - 1)
    elif depth > 0 and isinstance(value, dict):
        for item in value.values():
            yield from iter_tensors(item, tensor, depth - 1)


def map_tensors(value: Any, tensor: type, change: Callable[[Any], Any], depth: int = 3) -> Any:
    """A copy of ``value`` with ``change`` applied to each tensor, ``depth`` levels down;
    containers without a tensor come back as the same objects."""
    if isinstance(value, tensor):
        return change(value)
    if depth <= 0:
        return value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):  # not a namedtuple
        return tuple(map_tensors(v, tensor, change, depth - 1) for v in value)
    if isinstance(value, list):
        return [map_tensors(v, tensor, change, depth - 1) for v in value]
    if isinstance(value, dict):
        return {k: map_tensors(v, tensor, change, depth - 1) for k, v in value.items()}
    return value


class Call:
    """One risky call in progress: its arguments, the original, and what the original did."""

    __slots__ = (
        "_callsite",
        "args",
        "has_result",
        "instance",
        "kwargs",
        "library_error",
        "original",
        "result",
        "target",
    )

    def __init__(
        self,
        target: Target,
        original: Callable[..., Any],
        instance: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.target = target
        self.original = original
        self.instance = instance
        self.args = args
        self.kwargs = kwargs
        self.has_result = False
        self.result: Any = None
        self.library_error: BaseException | None = None
        self._callsite: str | None = None

    def proceed(
        self, args: tuple[Any, ...] | None = None, kwargs: dict[str, Any] | None = None
    ) -> Any:
        """Run the original callable (with these arguments, if given)."""
        try:
            result = self.original(
                *(self.args if args is None else args),
                **(self.kwargs if kwargs is None else kwargs),
            )
        except BaseException as exc:
            self.library_error = exc
            raise
        self.has_result = True
        self.result = result
        return result

    def replace(self, name: str, position: int, value: Any) -> None:
        """Pass ``value`` for this argument to ``proceed()`` (the caller's objects are kept)."""
        if name in self.kwargs or position >= len(self.args):
            self.kwargs = {**self.kwargs, name: value}
        else:
            self.args = (*self.args[:position], value, *self.args[position + 1 :])

    def argument(self, name: str, position: int, default: Any = None) -> Any:
        """An argument passed by keyword ``name`` or at ``position``."""
        return argument(self.args, self.kwargs, name, position, default)

    @property
    def callsite(self) -> str:
        if self._callsite is None:
            target = self.target
            # A rule names the user's own code: its caller there is the call site. A
            # library's own frames lead to the user's code that called into it.
            library = () if target.rule else (target.module.partition(".")[0],)
            self._callsite = find_callsite(*library, *target.skip)
        return self._callsite
