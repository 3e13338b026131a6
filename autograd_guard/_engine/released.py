"""What ``uninstall()`` lets go of for torch.compile: the proxies' ``_torchdynamo_inline``
and the modules of the traceable copies of remedies (``_compile.compiled.traceable``).

torch.compile keeps the module of a copy it traced in the compiled caller's globals (for
the guards of the graph), for as long as that caller lives: once released, the module
holds nothing of its guard, so that the guards of an uninstall are collected.
"""

from __future__ import annotations

import sys
import types

from autograd_guard._common import STATE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def uninstalled(replacements: list[Any]) -> None:
    """torch.compile traces the original in place of each of the proxies in
    ``replacements`` (what the patches put in place) from now on, also where the user
    still holds one, and the modules of the traceable copies leave ``sys.modules``."""
    from autograd_guard._compile import dynamo_frames as _dynamo_frames
    from autograd_guard._runtime import patching as _patching

    for replacement in replacements:
        proxy = _patching._callable_part(replacement)
        kind = type(proxy)
        if kind in _dynamo_frames.DYNAMO.classmethod_proxies:
            _dynamo_frames.DYNAMO.classmethod_proxies.remove(kind)
        if "_torchdynamo_inline" not in vars(kind):
            continue
        original = getattr(proxy, "__wrapped__", None)
        if isinstance(original, types.FunctionType):  # traced in the proxy's place
            kind._torchdynamo_inline = original  # type: ignore[attr-defined]
        else:  # traced as the proxy, which passes for its original
            _dynamo_frames.without_inline(kind)
    with STATE.patch_lock:
        names, STATE.traced_modules = STATE.traced_modules, []
        modules = [sys.modules.pop(name, None) for name in names]
    for module in modules:
        if module is not None:
            _release(module.__dict__["compiled"])


def _release(state: Any) -> None:
    """Nothing in the state of a traceable copy holds its guard any more. The guards of
    the graphs that traced the copy fail from now on (the guard is not active), so that
    their callers recompile; a call that such a graph still makes runs the original."""
    from autograd_guard._runtime.guard import Guard

    original = getattr(state, "original", None)
    for key, value in list(vars(state).items()):
        if isinstance(value, Guard):
            setattr(state, key, _UNINSTALLED)
        elif key in ("eager", "proxy"):  # the guarded call: the original now
            setattr(state, key, original)
        elif key != "original" and getattr(value, "__closure__", None) is not None:
            setattr(state, key, _released)  # an event or a question asked while tracing


def _released() -> None:
    """What a traceable copy calls, after uninstall, where it asked its guard something
    (Dynamo runs it rather than traces it, as ``_compile.compiled.marked_constant`` says)."""


_released._dynamo_marked_constant = True  # type: ignore[attr-defined]


class _Uninstalled:
    """Stands for the guard of a traceable copy after uninstall."""

    active = False


_UNINSTALLED = _Uninstalled()
