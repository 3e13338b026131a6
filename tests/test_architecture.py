"""The package's shape, read from its source with ``ast``: its folders are layers, and
every import points down the declared order (``LAYERS``); no import cycles between its
modules (imports inside functions and under ``if TYPE_CHECKING:`` count: a type-only cycle
is a cycle of the design); no class whose state lives in another class (a mixin that
declares what it borrows) and no class mixed from the package's own; at most 15 modules at
the package root; a docstring on every module, every function at most 50 lines (a
module's size is a guideline: docs/contributing.md), and one ``TYPE_CHECKING`` idiom."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "autograd_guard"
MAX_FUNCTION_LINES = 50
MAX_ROOT_MODULES = 15

# Classes mixed before the rule against borrowed state (grad_health's parts are composed;
# these are next): Warp's tape and grad_audit (a mixin of launches, of calls, each with its
# guard) and the Guard base's events half (it reads ``mode`` and ``version`` that ``Guard``
# sets)
OLDER = (
    "autograd_guard.guards.grad_audit",
    "autograd_guard.guards.grad_audit.calls",
    "autograd_guard.guards.warp_tape",
    "autograd_guard.guards.warp_tape.launch",
    "autograd_guard._runtime.interventions",
)

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


def package_classes() -> dict[str, tuple[str, ast.ClassDef]]:
    """Every class of the package by name: (its module, its definition)."""
    return {
        node.name: (name, node)
        for name in MODULES
        for node in ast.walk(parse(name))
        if isinstance(node, ast.ClassDef)
    }


RECORDS = ("NamedTuple", "Protocol", "TypedDict")  # their annotations are their fields


def borrowed(node: ast.ClassDef) -> list[str]:
    """The attributes ``node`` declares (``name: type`` in its body, no value, not a
    ``ClassVar``) and never sets itself (``self.name = ...`` in one of its methods): state
    or methods it expects another class to provide."""
    if any(ast.unparse(base).rpartition(".")[2] in RECORDS for base in node.bases):
        return []
    declared = [
        item.target.id
        for item in node.body
        if isinstance(item, ast.AnnAssign)
        and item.value is None
        and isinstance(item.target, ast.Name)
        and "ClassVar" not in ast.unparse(item.annotation)
    ]
    assigned = {
        target.attr
        for item in ast.walk(node)
        if isinstance(item, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        for target in (item.targets if isinstance(item, ast.Assign) else [item.target])
        for target in (target.elts if isinstance(target, ast.Tuple) else [target])
        if isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self"
    }
    return [attribute for attribute in declared if attribute not in assigned]


def test_no_class_keeps_its_state_in_another_class():
    """What the old 300-line cap stood for: a class owns its state. A mixin that declares
    the attributes and methods it borrows from the class it is mixed into (``_probe:
    BackwardProbe | None``, ``emit: Callable[..., bool]``) spreads one class over files,
    and no reader or tool can follow a call through a borrowed name. Parts are composed,
    each handed what it uses when it is made. (Guards made before this rule keep their
    layout: ``OLDER``.)"""
    found = {
        f"{module}.{name}: {', '.join(names)}"
        for name, (module, node) in package_classes().items()
        if (names := borrowed(node)) and module not in OLDER
    }
    assert sorted(found) == []


def test_no_class_is_mixed_from_the_package_own_classes():
    """A class derives from at most one class of the package (``GradHealth(Guard)``, not
    ``GradHealth(StepFlow, RepairFlow, ..., Guard)``)."""
    classes = package_classes()
    mixed = [
        f"{module}.{node.name}({', '.join(ast.unparse(base) for base in node.bases)})"
        for module, node in classes.values()
        if module not in OLDER
        and sum(ast.unparse(base).rpartition(".")[2] in classes for base in node.bases) > 1
    ]
    assert mixed == []


def test_a_borrowed_attribute_is_found():
    tree = ast.parse(
        "class Flow:\n    _probe: object\n    mode: str\n"
        "    def __init__(self):\n        self.mode = 'fix'\n"
        "class Fields(NamedTuple):\n    a: int\n"
    )
    flow, fields = (n for n in tree.body if isinstance(n, ast.ClassDef))
    assert borrowed(flow) == ["_probe"] and borrowed(fields) == []


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
