"""Where a guarded call came from: the ``file:line`` of the first frame of the user's code
that called the wrapped function, for events (one per guard, action and call site)."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType

# Frames in these folders are never a call site: ours, then wrapt's (added on first use).
_OWN_DIRS: list[str] = [os.path.dirname(os.path.abspath(__file__)) + os.sep]


def _wrapt_dir() -> str:
    import wrapt

    return os.path.dirname(os.path.abspath(wrapt.__file__)) + os.sep


# The ids of the wrappers' code objects (filled by _wrapper), matched by identity: a code
# object that torch.compile rewrote may hold constants that cannot be hashed (torch 2.1).
WRAPPER_CODES: set[int] = set()


# Never the call site while the user's code is on the stack: torch (``nn.Module.__call__``),
# the standard library (``unittest``'s ``assertRaises``, ``threading``) and test runners.
_INFRASTRUCTURE = frozenset({"torch", "_pytest", "pytest", "pluggy", *sys.stdlib_module_names})


def find_callsite(*libraries: str, start: FrameType | None = None) -> str:
    """``file:line`` of the code that called the wrapped function.

    Starts above the engine's wrapper frame (or at ``start``), so a guard's own frames
    never count (wherever the guard lives), and skips wrapt. The first frame of the
    user's code wins: outside torch, the standard library, test runners and the
    ``libraries`` (top-level package names); else the first frame outside the
    infrastructure (a library's own tests); else the first frame at all.
    """
    if len(_OWN_DIRS) == 1:
        _OWN_DIRS.append(_wrapt_dir())
    own = tuple(_OWN_DIRS)
    frame: FrameType | None = start
    if frame is None:
        frame = start = sys._getframe(1)
        while frame is not None and id(frame.f_code) not in WRAPPER_CODES:
            frame = frame.f_back
        frame = frame.f_back if frame is not None else start
    library_frame = first_frame = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(own):
            package = frame.f_globals.get("__name__", "").partition(".")[0]
            first_frame = first_frame or frame
            if package not in _INFRASTRUCTURE:
                if package not in libraries:
                    return _where(frame)
                library_frame = library_frame or frame
        frame = frame.f_back
    found = library_frame or first_frame
    return _where(found) if found is not None else "<unknown>"


def _where(frame: FrameType) -> str:
    return f"{os.path.normpath(frame.f_code.co_filename)}:{frame.f_lineno}"
