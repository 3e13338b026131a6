"""The package's shape, read from its source with ``ast``: its folders are layers, and
every import points down the declared order (``LAYERS``); no import cycles between its
modules (imports inside functions and under ``if TYPE_CHECKING:`` count: a type-only cycle
is a cycle of the design); at most 15 modules at the package root; a docstring on every
module, every module at most 300 lines and every function at most 50, and one
``TYPE_CHECKING`` idiom."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "autograd_guard"
MAX_MODULE_LINES = 300
MAX_FUNCTION_LINES = 50
MAX_ROOT_MODULES = 15

# The layers, highest first: a module may import its own layer or a lower one, never a
# higher one. Each entry names module prefixes (a folder, or a root module).
LAYERS = (
    ("app", ("autograd_guard", "cli", "pytest_plugin", "testing", "_run", "_cli")),
    ("boot", ("_boot",)),
    ("engine", ("_engine",)),
    ("guards", ("guards",)),
    ("guard API", ("guard", "taubin")),
    ("runtime", ("_runtime",)),
    ("policy", ("_policy",)),
    ("compile", ("_compile",)),
    ("events", ("_events",)),
    ("common", ("_common", "errors")),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def parse(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(encoding="utf-8"), str(MODULES[name]))


def imported_modules(name: str) -> set[str]:
    """The package's modules that ``name`` imports anywhere (functions and
    ``if TYPE_CHECKING:`` blocks included)."""
    tree = parse(name)
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
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
    assert "autograd_guard.guards" in imported_modules("autograd_guard._engine.engine")
    # and so is a type-only one: the Guard base class is typed by the policy it reads
    assert "autograd_guard._policy.data" in imported_modules("autograd_guard._runtime.guard")


def layer_of(name: str) -> int:
    """The index in ``LAYERS`` of the module ``name`` (0 is the highest layer)."""
    relative = name.removeprefix("autograd_guard").removeprefix(".")
    first = relative.partition(".")[0] or "autograd_guard"
    for index, (_, prefixes) in enumerate(LAYERS):
        if first in prefixes:
            return index
    raise AssertionError(f"{name} is in no layer: add its folder to LAYERS")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of ``graph`` from a lower layer to a higher one."""
    return [
        f"{name} ({LAYERS[layer_of(name)][0]}) imports {imported} ({LAYERS[layer_of(imported)][0]})"
        for name in sorted(graph)
        for imported in sorted(graph[name])
        if layer_of(imported) < layer_of(name)
    ]


def test_imports_point_down_the_layers():
    graph = {name: imported_modules(name) for name in MODULES}
    assert upward_imports(graph) == []


def test_an_upward_import_is_found():
    graph = {
        "autograd_guard._common.cache": {"autograd_guard._engine.engine"},
        "autograd_guard._engine.engine": {"autograd_guard._common.cache"},
    }
    assert upward_imports(graph) == [
        "autograd_guard._common.cache (common) imports autograd_guard._engine.engine (engine)"
    ]
    assert layer_of("autograd_guard") == 0
    assert layer_of("autograd_guard.errors") == layer_of("autograd_guard._common.cache")


def test_the_package_root_is_its_public_surface():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


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
