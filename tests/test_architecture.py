"""The package's shape, read from its source with ``ast``: no import cycles between its
modules (imports inside functions count; those under ``if TYPE_CHECKING:`` never run and
do not), a docstring on every module, every module at most 300 lines and every function
at most 50, and one ``TYPE_CHECKING`` idiom."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "autograd_guard"
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 50


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def parse(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(encoding="utf-8"), str(MODULES[name]))


def type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            skipped.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return skipped


def imported_modules(name: str) -> set[str]:
    """The package's modules that ``name`` imports anywhere (functions included)."""
    tree = parse(name)
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    skipped = type_checking_only(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            # "from package import module" imports the module; a name imports its module
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    # "import a.b.c" imports a.b too; keep the deepest module of the package each names.
    known = set()
    for imported in found:
        while imported and imported not in MODULES:
            imported = imported.rpartition(".")[0]
        if imported:
            known.add(imported)
    known.discard(name)
    return known


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as the path that closes it), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for neighbour in sorted(graph[node]):
            cycle = visit(neighbour, [*path, node])
            if cycle:
                return cycle
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start, [])
        if cycle:
            return cycle
    return None


def test_the_package_has_no_import_cycle():
    graph = {name: imported_modules(name) for name in MODULES}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    # _engine imports the guards inside install(): a function-level import is an edge.
    assert "autograd_guard.guards" in imported_modules("autograd_guard._engine")


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_are_short(name):
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines"


def test_functions_are_short():
    long = []
    for name in MODULES:
        for node in ast.walk(parse(name)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not long


def test_type_checking_is_the_cheap_constant():
    """``TYPE_CHECKING = False`` then ``if TYPE_CHECKING:``, never imported from typing."""
    found = [
        name
        for name in MODULES
        for node in ast.walk(parse(name))
        if isinstance(node, ast.ImportFrom)
        and node.module == "typing"
        and any(alias.name == "TYPE_CHECKING" for alias in node.names)
    ]
    assert found == []


def test_every_module_says_its_concern():
    assert [name for name in MODULES if not ast.get_docstring(parse(name))] == []
