"""A check compiled into a library function itself, in place of a wrapper: its
``__code__`` rebuilt from the library's own source with one statement first::

    if NAME or record_tape and runtime is not None and runtime.tape is not None:
        inputs = HOOK(kernel, inputs, outputs, adjoint, record_tape, record_cmd)

(``warp_tape``'s: a condition of the function's parameters and its module's globals.)
``NAME`` (a list, the guard's switch) and ``HOOK`` are put in the function's module
globals: with the switch off and no tape recording, the statement costs a few global and
attribute reads; otherwise the hook runs in the function's own frame's call, with no frame
of ours between the caller and the library. So Warp's
record of a launch's caller, tracebacks and everything that reads the stack are as
unguarded. The same file name and line numbers: the new statement takes the line of the
first statement of the body, after the docstring.

It is used only where compiling the unmodified source gives back the loaded code object
(its bytecode, constants, names and line table): a source file edited since the import, a
decorated or nested function, or a Python whose compiler differs from the one that made
the loaded code gets the wrapper instead. ``undo`` puts the original code back and
removes the names. (ddtrace's dynamic instrumentation injects hooks into live functions'
bytecode for the same reason: no frame of its own.)
"""

from __future__ import annotations

import ast
import linecache
import types

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

TOP_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_@")
TOP_SKIP = (" ", "\t", "#", "\n", "\r", "")  # what no top-level statement starts with
BLOCKS = ("if ", "try:", "else:", "elif ", "except", "finally:")
# What the compiled code must share with the loaded code.
SAME = (
    "co_code",
    "co_names",
    "co_varnames",
    "co_freevars",
    "co_cellvars",
    "co_flags",
    "co_argcount",
    "co_kwonlyargcount",
    "co_firstlineno",
    "co_filename",
)


def install(
    function: Callable[..., Any],
    name: str,
    hook: Any,
    call: str,
    condition: str | None = None,
    more: dict[str, Any] | None = None,
) -> types.CodeType | None:
    """Compile ``if <condition>: <call>`` (``condition``: ``name`` where None; a statement
    of the function's parameters and globals) first into ``function``, whose globals get
    ``name = hook`` and ``more``; its original code (for ``undo``). None, with nothing
    changed, where the source does not give back the loaded code."""
    code = function.__code__
    names = {name: hook, **(more or {})}
    if any(n in function.__globals__ for n in names):
        return None  # one prelude per name: another guard's (or an earlier install's)
    source = _source(function)
    built = _compile(code, source, None)
    if built is None or not _same(built, code):
        return None
    statement = ast.parse(f"if {condition or name}:\n    {call}\n").body[0]
    prelude = _compile(code, source, statement)
    if prelude is None or any(
        getattr(prelude, a) != getattr(code, a)
        for a in ("co_varnames", "co_freevars", "co_cellvars", "co_firstlineno")
    ):
        return None  # the statement must name only parameters, and the function keeps its own
    function.__globals__.update(names)
    function.__code__ = prelude
    return code


def undo(
    function: Callable[..., Any], original: types.CodeType, name: str, more: tuple[str, ...] = ()
) -> None:
    """The original code back, then ``name`` (and ``more``) out of its globals."""
    function.__code__ = original
    for each in (name, *more):
        function.__globals__.pop(each, None)


def _source(function: Callable[..., Any]) -> str | None:
    """The source of ``function``'s module as far as its ``def``: the module's imports on
    the lines above it (the compiler treats a name an import binds differently:
    ``ctypes.cast(...)`` is LOAD_ATTR, not LOAD_METHOD), then the ``def`` on its own line;
    None where it cannot be had or is not one plain ``def`` at the module's top level."""
    code = function.__code__
    start = code.co_firstlineno
    lines = linecache.getlines(code.co_filename)[start - 1 :]
    if not lines or not lines[0].startswith(("def ", "async def ")):
        return None  # decorated, nested, or no source: not made by this def alone
    # up to the next top-level statement (inspect.getblock tokenizes: 50 ms here)
    end = next((i for i, line in enumerate(lines[1:], 1) if line[:1] in TOP_START), None)
    lines = lines[:end]
    imports = _module_imports(code.co_filename, start)
    if imports is None:
        return None
    return "\n".join(imports) + "\n" * (start - len(imports)) + "".join(lines)


def _compile(
    code: types.CodeType, source: str | None, first: ast.stmt | None
) -> types.CodeType | None:
    """The function of ``source`` compiled anew, ``first`` put first in its body (after
    its docstring)."""
    if source is None:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    *_, definition = tree.body
    if not isinstance(definition, ast.FunctionDef) or definition.name != code.co_name:
        return None
    if first is not None:
        body = definition.body
        at = 1 if body and isinstance(body[0], ast.Expr) and _is_text(body[0].value) else 0
        anchor = body[at] if at < len(body) else body[0]
        for node in ast.walk(first):
            ast.copy_location(node, anchor)
        body.insert(at, first)
    module = compile(tree, code.co_filename, "exec", dont_inherit=True)
    found = [c for c in module.co_consts if isinstance(c, types.CodeType)]
    return found[0] if len(found) == 1 else None


def _is_text(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _same(built: types.CodeType, loaded: types.CodeType) -> bool:
    if any(getattr(built, a) != getattr(loaded, a) for a in SAME):
        return False
    if list(built.co_lines()) != list(loaded.co_lines()):
        return False
    if getattr(built, "co_exceptiontable", b"") != getattr(loaded, "co_exceptiontable", b""):
        return False
    consts = zip(built.co_consts, loaded.co_consts, strict=False)
    return len(built.co_consts) == len(loaded.co_consts) and all(
        _same(a, b) if isinstance(a, types.CodeType) else type(a) is type(b) and a == b
        for a, b in consts
    )


def _module_imports(filename: str, start: int) -> list[str] | None:
    """The import statements of a module above line ``start``, at its top level (in a
    top-level ``if``/``try`` too), one line each; None where there are more than lines."""
    lines = linecache.getlines(filename)[: start - 1]
    found: list[str] = []
    block, index = False, 0
    while index < len(lines):  # plain tests first: Warp's context module has 17,000 lines
        line = lines[index]
        if line[:1] not in TOP_SKIP:  # a top-level statement
            block = line.startswith(BLOCKS)
            text = line if line.startswith(("import ", "from ")) else ""
        else:
            text = line[4:] if block and line.startswith(("    import ", "    from ")) else ""
        if text:
            text = text.strip()
            while text.count("(") > text.count(")") or text.endswith("\\"):
                index += 1
                if index >= len(lines):
                    return None
                text = text.rstrip("\\") + " " + lines[index].strip()
            found.append(text.split("#")[0].strip())
        index += 1
    return found if len(found) < start else None
