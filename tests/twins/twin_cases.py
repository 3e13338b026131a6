"""The corpus's cases: one program per file in ``cases/``, with a ``TWIN`` literal saying how
to run it and what the guard may change.

A case is ordinary user code: a module ``case`` whose ``main()`` the child runs; rules name
its functions as ``case:stage``. ``TWIN`` is read from the source (an expression of literals
and operators, evaluated without builtins), never by importing the case:

    TWIN = {
        "policy": '''[[rules]] ...''',   # autograd_guard.toml (default: none, the preset)
        "modes": ["fix", "strict"],      # or {mode: expectation}; default: fix only
        "libraries": ["gsplat"],         # third-party folders the program imports
        "files": {"pkg/mod.py": "..."},  # more modules beside case.py
        "xfail": "why",                  # a known difference, fixed elsewhere
        "requires": ["pytorch3d._C"],    # compiled code the program runs (see REQUIRES),
    }                                    # or what this torch must do (see CONDITIONS)

On correct code ``fix`` is enough, as ``strict`` raises exactly where ``fix`` would log; a
case names ``strict`` and ``observe`` where they take another path (torch.compile,
TorchScript, generators, the exceptions themselves).

An expectation (per mode) holds ``events`` (``"guard/action"``, one per call site; none by
default), ``maybe`` (events that only some interpreters log, such as a note that Python
3.10 cannot attach to the exception), ``like`` (``"handfix"``: compare with the unguarded
run that applies the fix by hand, where ``TWIN_HANDFIX=1``; default: the plain unguarded
run), ``raises`` (the qualified exception type the guarded run ends with; its output is
then not compared) and ``stderr`` (text that a line the guarded run writes to stderr, and
that starts with ``autograd-guard``, may hold: an exception's note, which Python 3.10 does
not print, or the strict stop's line; any other such line is a difference).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

CASES_DIR = Path(__file__).resolve().parent / "cases"
MODES = ("fix", "observe", "strict")
DEFAULT_MODES = ("fix",)
CASE_KEYS = {"policy", "modes", "libraries", "files", "xfail", "requires"}
EXPECTATION_KEYS = {"events", "maybe", "like", "raises", "stderr"}
LIBRARIES = {
    "gsplat",
    "pytorch3d",
    "warp-1.5.1",
    "warp-1.19.0",
    "warp-1.16.0",
    "pot-0.9.3",
    "pot-0.9.7",
    "ipex-2.1.10+xpu",
    "pytorch_optimizer",
    "accelerate",
    "lightning",
    "roma-1.2.1",
}
# Compiled code a case may need, and the test file that runs such cases (where that code
# imports; test_twins.py runs only the cases that need none of it). PyTorch3D's compiled
# extension comes from the environment's own PyTorch3D, never from the Python-only copy
# that ``"libraries": ["pytorch3d"]`` puts first on the path.
REQUIRES = {"pytorch3d._C": "tests/test_pytorch3d_twins.py"}
# What the libraries of this interpreter (the child's torch: the runner's venv sees the test
# process's packages) must do for a case to show what it declares, asked in the test process
# (each a guard's own probe); the case is skipped, with the reason, where it does not hold.
CONDITIONS = {  # each with its negation, "no_" + name
    "pytorch3d_euler_gimbal_bug": "matrix_to_euler_angles's gradient at gimbal lock is "
    "non-finite with this torch (up to 2.13)",
    "no_pytorch3d_euler_gimbal_bug": "matrix_to_euler_angles's gradient at gimbal lock is "
    "finite with this torch (2.15: clamp's backward is 0 at its bounds)",
    "grad_audit_on": "grad_audit attaches to this torch (2.2 and newer: 2.1's Dynamo breaks "
    "the graph at a hooked Function)",
    "no_grad_audit_on": "grad_audit stands down with this torch (2.1)",
}


@dataclass(frozen=True)
class Expectation:
    events: tuple[str, ...] = ()
    maybe: tuple[str, ...] = ()
    like: str = "plain"
    raises: str | None = None
    stderr: str | None = None


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    doc: str
    policy: str | None = None
    modes: dict[str, Expectation] = field(default_factory=dict)
    libraries: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    xfail: str | None = None
    requires: tuple[str, ...] = ()

    def compiled(self) -> bool:
        """Whether the case needs compiled code that is not always there (REQUIRES)."""
        return any(name in REQUIRES for name in self.requires)

    def unmet(self) -> str | None:
        """Why this interpreter cannot run the case (a condition that does not hold)."""
        unmet = [name for name in self.requires if name in CONDITIONS and not holds(name)]
        return f"{self.name} requires: {CONDITIONS[unmet[0]]}" if unmet else None

    def variants(self) -> list[str]:
        """The runs a comparison needs: the unguarded ones, then each guarded mode."""
        references = sorted({e.like for e in self.modes.values()} | {"plain"})
        return [*references, *self.modes]


def load_case(path: Path) -> Case:
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    spec = next(
        (
            eval(  # our own files; a literal, or one such as "[" * 3000
                compile(ast.Expression(node.value), str(path), "eval"), {"__builtins__": {}}
            )
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "TWIN" for t in node.targets)
        ),
        None,
    )
    if not isinstance(spec, dict) or not set(spec) <= CASE_KEYS:
        raise ValueError(f"{path.name}: TWIN must be a dict with keys from {sorted(CASE_KEYS)}")
    libraries = tuple(spec.get("libraries", ()))
    if not set(libraries) <= LIBRARIES:
        raise ValueError(f"{path.name}: libraries must be from {sorted(LIBRARIES)}")
    requires = tuple(spec.get("requires", ()))
    if not set(requires) <= set(REQUIRES) | set(CONDITIONS):
        raise ValueError(
            f"{path.name}: requires must be from {sorted(REQUIRES)} or {sorted(CONDITIONS)}"
        )
    if "pytorch3d._C" in requires and "pytorch3d" in libraries:
        raise ValueError(
            f"{path.name}: requires pytorch3d._C, which the Python-only library 'pytorch3d' "
            "would hide: leave 'pytorch3d' out of libraries"
        )
    return Case(
        name=path.stem,
        source=source,
        doc=(ast.get_docstring(tree) or "").split("\n")[0],
        policy=spec.get("policy"),
        modes=_expectations(path.name, spec.get("modes", DEFAULT_MODES)),
        libraries=libraries,
        files=dict(spec.get("files", {})),
        xfail=spec.get("xfail"),
        requires=requires,
    )


def _expectations(name: str, modes: object) -> dict[str, Expectation]:
    if isinstance(modes, (list, tuple)):
        modes = {mode: {} for mode in modes}
    if not isinstance(modes, dict) or not modes or not set(modes) <= set(MODES):
        raise ValueError(f"{name}: modes must name some of {MODES}")
    expectations = {}
    for mode, spec in modes.items():
        if not set(spec) <= EXPECTATION_KEYS or spec.get("like", "plain") not in (
            "plain",
            "handfix",
        ):
            raise ValueError(f"{name}: modes[{mode!r}] takes {sorted(EXPECTATION_KEYS)}")
        expectations[mode] = Expectation(
            events=tuple(sorted(spec.get("events", ()))),
            maybe=tuple(spec.get("maybe", ())),
            like=spec.get("like", "plain"),
            raises=spec.get("raises"),
            stderr=spec.get("stderr"),
        )
    return expectations


def all_cases() -> list[Case]:
    return [load_case(path) for path in sorted(CASES_DIR.glob("*.py"))]


def holds(condition: str) -> bool:
    """Whether a CONDITIONS entry holds with this interpreter's torch and libraries."""
    negated = condition.startswith("no_")
    return _asked(condition.removeprefix("no_")) is not negated


def _asked(condition: str) -> bool:
    if condition == "pytorch3d_euler_gimbal_bug":
        import inspect

        from pytorch3d.transforms import rotation_conversions

        from autograd_guard.guards.pytorch3d_euler_gimbal import nonfinite_at_lock

        return nonfinite_at_lock(inspect.unwrap(rotation_conversions.matrix_to_euler_angles))
    if condition == "grad_audit_on":
        import torch
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        from autograd_guard.guards.grad_audit import GradAudit

        return Version(torch.__version__.split("+")[0]) in SpecifierSet(GradAudit.affected)
    raise ValueError(f"unknown condition {condition!r}: CONDITIONS are {sorted(CONDITIONS)}")
