"""Where a guarded call came from: the ``file:line`` of the first frame of the user's code
that called the wrapped function, for events (one per guard, action and call site).

Under ``torch.compile`` the user's frame may run code that torch made from it:

- a ``torch.fx`` graph (``allow_in_graph``, an aot backend that runs it eagerly, a backend
  returning ``gm.forward``, ``torch.fx.symbolic_trace``): its frames count as torch's,
  and the call site is the line the graph's node was traced from (torch 2.2 and newer
  keep it), else the user's frame that called into the graph;
- while Dynamo traces, a call run on fake tensors: the line Dynamo traces;
- the code Dynamo rewrote from the user's function (or a resume function after a graph
  break), whose lines some torch releases lose: every instruction on the ``def`` line
  (torch 2.6 on CPython 3.12 at a graph break), or on a line of torch's template for a
  ``with`` block around a graph break (the same torch, a line the code it was rewritten
  from does not have). There the line is found in the code it was rewritten from: the
  last call before the point where the next resume function resumes (or the line that
  resume function is named after); with none, the last line that loads the callee's
  name, else the ``def`` line.

Reading torch's internals never fails a call site: the frame's own line stands.
"""

from __future__ import annotations

import os
import re
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from types import FrameType
    from typing import Any

# Frames in these folders are never a call site: ours, then wrapt's (added on first use).
OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the package
_OWN_DIRS: list[str] = [OWN_DIR]


def _wrapt_dir() -> str:
    import wrapt

    return os.path.dirname(os.path.abspath(wrapt.__file__)) + os.sep


# The ids of the wrappers' code objects (filled by _runtime.wrapper), matched by identity: a code
# object that torch.compile rewrote may hold constants that cannot be hashed (torch 2.1).
WRAPPER_CODES: set[int] = set()


# Never the call site while the user's code is on the stack: torch (``nn.Module.__call__``),
# the standard library (``unittest``'s ``assertRaises``, ``threading``) and test runners.
_INFRASTRUCTURE = frozenset({"torch", "_pytest", "pytest", "pluggy", *sys.stdlib_module_names})

_TRACE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
# the resume function that Dynamo calls after a graph break, and its code's offset
_RESUME = re.compile(r"__resume_at_(\d+)")
_RESUME_LINE = re.compile(r"torch_dynamo_resume_in_\w+_at_(\d+)$")
# torch's modules whose frames know the user's line a traced call came from
_TRACERS = frozenset({"torch.fx.interpreter", "torch._dynamo.symbolic_convert"})


def find_callsite(*libraries: str, start: FrameType | None = None) -> str:
    """``file:line`` of the code that called the wrapped function.

    Starts above the engine's wrapper frame (or at ``start``), so a guard's own frames
    never count (wherever the guard lives), and skips wrapt. The first frame of the
    user's code wins: outside torch (and the code torch generated), the standard
    library, test runners and the ``libraries`` (top-level package names); else the
    first frame outside the infrastructure (a library's own tests); else the first frame.
    """
    if len(_OWN_DIRS) == 1:
        _OWN_DIRS.append(_wrapt_dir())
    own = tuple(_OWN_DIRS)
    frame: FrameType | None = start
    wrapped = start is None  # the callee's name is read off the wrappers' frames
    if frame is None:
        frame = start = sys._getframe(1)
        while frame is not None and id(frame.f_code) not in WRAPPER_CODES:
            frame = frame.f_back
        frame = frame or start
    library_frame = first_frame = traced = callee = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if wrapped and id(frame.f_code) in WRAPPER_CODES:  # the outermost one wins
            callee = getattr(frame.f_locals.get("original"), "__name__", None)
        elif not filename.startswith(own):
            module = frame.f_globals.get("__name__", "")
            package = module.partition(".")[0]
            first_frame = first_frame or frame
            if traced is None and (module in _TRACERS or filename.startswith("<eval_with_key>")):
                skipped = own + tuple(_package_dirs(("torch", *libraries)))
                traced = _fail_open(_traced_line, frame, skipped)
            if package not in _INFRASTRUCTURE and not _generated(frame):
                if package not in libraries:
                    return traced or _where(frame, callee)
                library_frame = library_frame or frame
        frame = frame.f_back
    found = library_frame or first_frame
    return traced or (_where(found, callee) if found is not None else "<unknown>")


def _generated(frame: FrameType) -> bool:
    """Code that torch generated: a ``torch.fx`` graph's ``forward`` (the file
    ``<eval_with_key>.N``, its source kept by torch's loader), or a pseudo-file
    (``<string>``) evaluated with no module of its own and called by torch (the lambdas
    of ``make_fx``, which aot backends trace with)."""
    filename = frame.f_code.co_filename
    if not filename.startswith("<"):
        return False
    if filename.startswith("<eval_with_key>"):
        return True
    globals_ = frame.f_globals
    if type(globals_.get("__loader__")).__module__.partition(".")[0] == "torch":
        return True
    caller = frame.f_back
    return (
        "__name__" not in globals_
        and caller is not None
        and caller.f_globals.get("__name__", "").partition(".")[0] == "torch"
    )


def _traced_line(frame: FrameType, skipped: tuple[str, ...]) -> str | None:
    """The user's line that what runs in ``frame`` was traced from, or None: a node of a
    ``torch.fx`` graph, run by its ``forward`` (``<eval_with_key>``, torch 2.2 and newer
    map its lines to nodes) or by torch's interpreter (aot backends), as its
    ``stack_trace`` says; or the line Dynamo traces (a call run on fake tensors)."""
    local = frame.f_locals
    if frame.f_code.co_filename.startswith("<eval_with_key>"):
        module = local.get("self")
        lines = getattr(module, "_lineno_map", None) or {}
        index = lines.get(frame.f_lineno - frame.f_code.co_firstlineno)
        nodes = list(module.graph.nodes) if index is not None else []  # type: ignore[union-attr]
        node = nodes[index] if index is not None and index < len(nodes) else None
    else:
        node = local.get("n")
    trace = getattr(node, "meta", {}).get("stack_trace")
    for path, line in reversed(_TRACE_LINE.findall(trace or "")):
        if not os.path.abspath(path).startswith(skipped):
            return f"{os.path.normpath(path)}:{line}"
    return translator_line(local.get("self"), skipped)


def translator_line(translator: Any, skipped: tuple[str, ...]) -> str | None:
    """``file:line`` that Dynamo's instruction ``translator`` traces, unless its file is
    in ``skipped`` (None then, and where it is not a translator)."""
    code, line = getattr(translator, "f_code", None), getattr(translator, "lineno", None)
    filename = getattr(code, "co_filename", "")
    if isinstance(line, int) and line > 0 and filename and not filename.startswith(skipped):
        return f"{os.path.normpath(filename)}:{line}"
    return None


def _fail_open(read: Callable[..., Any], *args: Any) -> Any:
    """``read(*args)``, or None where torch's internals are not what it expects."""
    try:
        return read(*args)
    except Exception:
        return None


def _package_dirs(names: tuple[str, ...]) -> list[str]:
    dirs = []
    for name in names:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            dirs.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    return dirs


def _where(frame: FrameType, callee: str | None = None) -> str:
    line = frame.f_lineno
    code = frame.f_code
    foreign = _fail_open(_foreign_line, frame)
    if foreign or (line == code.co_firstlineno and callee is not None):
        found = _fail_open(_rewritten_line, frame, callee)
        line = found or (code.co_firstlineno if foreign else line)
    return f"{os.path.normpath(code.co_filename)}:{line}"


def _source_code(frame: FrameType) -> Any:
    """The code Dynamo rewrote the frame's code from, or None (not rewritten)."""
    utils = sys.modules.get("torch._dynamo.utils")
    original = getattr(utils, "orig_code_map", None)
    return original.get(frame.f_code) if original is not None else None


def _foreign_line(frame: FrameType) -> bool:
    """Whether the frame runs Dynamo's rewritten code on a line that is not the user's:
    torch 2.6 on CPython 3.12 leaves the lines of the template that re-enters a ``with``
    block (``torch/_dynamo/resume_execution.py``, lines 148-152) in the rewritten code,
    so a call made inside ``with torch.no_grad():`` sits on a line of torch's file. The
    user's lines are those of the code it was rewritten from that carry columns."""
    source = _source_code(frame)
    if source is None:
        return False
    lines = {
        position[0]
        for position in source.co_positions()
        if position[0] is not None and position[2] is not None
    }
    return bool(lines) and frame.f_lineno not in lines


def _rewritten_line(frame: FrameType, callee: str | None) -> int | None:
    """The line of the call running in ``frame`` in the code Dynamo rewrote the frame's
    code from (its function's, or a resume function's): the last call before the offset
    where the resume function that follows it resumes; else (no resume function: the
    last call of the code) the last load of the name ``callee``, or the last call."""
    source = _source_code(frame)
    if source is None:
        return None
    import dis

    resume = _resume_point(dis.get_instructions(frame.f_code), frame.f_lasti)
    if isinstance(resume, int) and resume < 0:
        return -resume  # the resume function is named after the line
    loads, calls = [], []
    for line, instruction in _lines(dis.get_instructions(source)):
        if resume is not None and instruction.offset >= resume:
            break
        if instruction.opname.startswith("CALL"):
            calls.append(line)
        elif instruction.opname.startswith("LOAD_") and instruction.argval == callee:
            loads.append(line)
    found_lines = calls if resume is not None else loads or calls
    return found_lines[-1] if found_lines else None


def _resume_point(instructions: Iterable[Any], after: int) -> int | None:
    """Where the first resume function loaded after offset ``after`` resumes: the offset
    in the code Dynamo rewrote (``__resume_at_<offset>_<n>``), or minus the line (torch
    2.6 and newer name the function made with a closure ``..._resume_in_<f>_at_<line>``)."""
    for instruction in instructions:
        value = instruction.argval
        name = getattr(value, "co_name", value)
        if instruction.offset <= after or not isinstance(name, str):
            continue
        found = _RESUME.match(name)
        if found:
            return int(found.group(1))
        found = _RESUME_LINE.match(name)
        if found:
            return -int(found.group(1))
    return None


def _lines(instructions: Iterable[Any]) -> Iterator[tuple[int | None, Any]]:
    """Each instruction with its line (``positions`` on CPython 3.11 and newer)."""
    line = None
    for instruction in instructions:
        positions = getattr(instruction, "positions", None)
        start = instruction.starts_line
        if positions is not None and positions.lineno is not None:
            line = positions.lineno
        elif isinstance(start, int) and not isinstance(start, bool):
            line = start
        yield line, instruction
