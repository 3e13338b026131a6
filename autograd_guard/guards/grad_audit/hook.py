"""grad_audit's hook: ``torch.autograd.Function.apply`` (a Python classmethod; from torch
2.15 one written in C) replaced by a classmethod whose function looks the Function class
up in a dict and, once the class has had its first calls looked at, calls torch's own
``apply`` straight away.

Its function is named ``apply``, as torch's is: Dynamo recognises a Function's ``apply``
by its name and the class it is bound to (it traces the Function's ``forward`` and
``backward`` itself, never this wrapper), so a Function called inside a compiled region
is compiled as it is unguarded. Dynamo never compiles a frame of the wrapper either
(``skip``): met in the eager part of a graph break, it runs as plain Python.
"""

from __future__ import annotations

import threading
import weakref

from autograd_guard._compile.dynamo_frames import skip

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    # what the guard does with a class's first calls: (cls, original, args, kwargs)
    FirstCall = Callable[[type, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]


def make_apply(
    original: Callable[..., Any], done: weakref.WeakKeyDictionary[type, bool], first: FirstCall
) -> Any:
    """The function of the classmethod that replaces ``Function.apply``: one dict lookup
    per call once ``done`` holds the class."""

    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        if cls in done:
            return original(cls, *args, **kwargs)
        return first(cls, original, args, kwargs)

    apply.__wrapped__ = original  # type: ignore[attr-defined]
    apply.__qualname__ = "Function.apply"
    skip(apply.__code__)
    return apply


class ApplyHook:
    """Puts the wrapper in ``Function.__dict__["apply"]`` and takes it out again."""

    def __init__(self) -> None:
        # classes whose first calls were looked at (weakly: a class made at every call dies)
        self.done: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()
        self.busy = threading.local()  # the guard's own re-runs: passed straight through
        self._function: Any = None
        self._saved: Any = None

    def install(self, function: type, first: FirstCall) -> bool:
        """Wrap ``function.apply``: a classmethod in Python (torch 2.1 to 2.14), or one
        written in C (2.15: a ``classmethod_descriptor``, called with the class first).
        False where it is neither."""
        saved: Any = vars(function).get("apply")
        original: Callable[..., Any]
        if isinstance(saved, classmethod):
            original = saved.__func__
        elif type(saved).__name__ == "classmethod_descriptor":
            original = saved
        else:
            return False
        if self._function is not None:
            return False
        self._function, self._saved = function, saved
        function.apply = classmethod(make_apply(original, self.done, first))  # type: ignore[attr-defined]
        return True

    def uninstall(self) -> None:
        if self._function is not None:
            self._function.apply = self._saved
            self._function = self._saved = None

    def is_busy(self) -> bool:
        return getattr(self.busy, "on", False)
