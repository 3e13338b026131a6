"""The proxies put in place of guarded functions: ``wrapt.FunctionWrapper`` made to pickle,
copy and compile exactly like the original.

A bare wrapt proxy refuses ``pickle`` ("object proxy must define __reduce_ex__()"), which
breaks ``multiprocessing``, ``torch.save`` and ``deepcopy`` of anything that holds a
guarded function. A function pickles by reference (module and qualified name), and
unpickling that reference finds the wrapper again; a bound method pickles as
``getattr(instance, name)``. Copies of a function are the function itself. Imported only
when something is patched: wrapt costs ~65 ms without torch.
"""

from __future__ import annotations

import sys
from typing import Any

import wrapt


class _CopiedAsItself:
    """Copies of a function are the function itself."""

    __slots__ = ()  # no __dict__ descriptor of its own in front of the proxy's

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: Any) -> Any:
        return self


class GuardedBoundFunction(_CopiedAsItself, wrapt.BoundFunctionWrapper):  # type: ignore[misc, type-arg]
    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.__wrapped__.__reduce_ex__(protocol)


class GuardedFunction(_CopiedAsItself, wrapt.FunctionWrapper):  # type: ignore[misc, type-arg]
    __bound_function_wrapper__ = GuardedBoundFunction

    def __init__(self, wrapped: Any, wrapper: Any) -> None:
        super().__init__(wrapped, wrapper)
        self._self_compiled: dict[bool, Any] = {}

    @property
    def _torchdynamo_inline(self) -> Any:
        # torch.compile traces this function in place of the wrapper (a wrapt
        # proxy passes for the original function, whose code Dynamo would trace
        # past the guard). Read at every guard check: cached per fullgraph.
        fullgraph = _dynamo_fullgraph()
        inline = self._self_compiled.get(fullgraph)
        if inline is None:
            owner = getattr(self._self_wrapper, "_autograd_guard_compiled", None)
            inline = owner(self.__wrapped__, self, fullgraph) if owner else None
            inline = self._self_compiled[fullgraph] = inline or self.__wrapped__
        return inline

    @property
    def _torchscript_modifier(self) -> Any:
        # torch.jit.script compiles the original's source: say so, once.
        report = getattr(self._self_wrapper, "_autograd_guard_scripted", None)
        if report is not None:
            report()
        import torch

        return torch._jit_internal.FunctionModifiers.DEFAULT

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.__wrapped__.__qualname__


def _dynamo_fullgraph() -> bool:
    """Whether torch.compile is tracing right now with ``fullgraph=True``."""
    tracing = sys.modules.get("torch._dynamo.symbolic_convert")
    current = getattr(getattr(tracing, "tls", None), "current_tx", None)
    return bool(
        getattr(current, "one_graph", False) or getattr(current, "error_on_graph_break", False)
    )
