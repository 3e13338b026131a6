"""Every guard class is checked against the contract when it is loaded (as pluggy's
``_verify_hook``): its declarations, its hooks' signatures, and the methods its targets
name. A mistake is a ``TypeError`` naming the guard, the attribute and what is allowed,
at load time, instead of a hook that is silently never called.

Cheap on purpose (attribute and code-object reads, no ``inspect``, no ``packaging``): the
built-in guards are checked at every start.
"""

from __future__ import annotations

from autograd_guard._common.call import Target
from autograd_guard._policy.options import Option

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from autograd_guard._runtime.guard import Guard

# The hooks a guard may override, with their parameters after ``self``.
HOOKS = {
    "risky": ("instance", "args", "kwargs"),
    "handle": ("call",),
    "before": ("call",),
    "_targets_to_wrap": (),
    "_needed": (),
    "_attach": ("module", "target"),
    "_detach": (),
    "_prelude": ("module", "target"),
    "_check_for": ("target",),
    "_handler_for": ("target",),
    "_traced": ("target", "original"),
}
# What a target's own methods take, by the Target field that names them.
TARGET_METHODS = {"check": HOOKS["risky"], "handle": HOOKS["handle"], "traced": HOOKS["_traced"]}
# What the engine calls: a guard overrides the hook of the same name instead.
PUBLIC = (
    "targets_to_wrap",
    "needed",
    "attach",
    "detach",
    "prelude",
    "check_for",
    "handler_for",
    "traced",
    "wrapper_for",
)
# Hooks of the earlier contract, which the engine no longer calls.
RENAMED = {
    "_targets": "_targets_to_wrap",
    "_on_instrument": "_attach",
    "_on_import": "_attach",
    "_on_uninstall": "_detach",
    "instrument": "attach",
    "module_imported": "attach",
    "verdict": "needed",
    "version_affected": "is_affected",
    "intervene": "report",
}
# What a policy key (``[guards.<name>]``, ``AUTOGRAD_GUARD_DISABLE``) and a version may
# hold, besides ASCII letters and digits (no ``re``: the built-in guards are checked at
# every start).
NAME_MARKS = frozenset("_-")
VERSION_MARKS = frozenset(".*+!_-")
OPERATORS = ("~=", "===", "==", "!=", "<=", ">=", "<", ">")  # longest first where shared


def is_name(text: object) -> bool:
    """A bare TOML key: letters, digits, ``_`` and ``-``."""
    return isinstance(text, str) and bool(text) and all(_plain(c, NAME_MARKS) for c in text)


def is_specifier(text: object) -> bool:
    """A PEP 440 version specifier such as ``>=1.3,<1.6`` (``""``: every version)."""
    if not isinstance(text, str):
        return False
    for clause in text.split(",") if text.strip() else ():
        clause = clause.strip()
        operator = next((o for o in OPERATORS if clause.startswith(o)), None)
        version = clause[len(operator) :].strip() if operator else ""
        if not version or not all(_plain(c, VERSION_MARKS) for c in version):
            return False
    return True


def _plain(character: str, marks: frozenset[str]) -> bool:
    return (character.isascii() and character.isalnum()) or character in marks


VARARGS = 0x04  # CO_VARARGS


def check(guard: type[Guard]) -> None:
    """Raise ``TypeError`` where ``guard`` breaks the contract (the first problem found)."""
    from autograd_guard._runtime.guard import Guard

    where = f"guard {guard.__module__}.{guard.__qualname__}"
    _declarations(guard, where)
    for old, new in RENAMED.items():
        if callable(getattr(guard, old, None)):
            raise TypeError(f"{where}: {old!r} is no longer called; override {new!r} instead")
    for public in PUBLIC:
        if getattr(guard, public) is not getattr(Guard, public):
            raise TypeError(f"{where}: {public!r} is the engine's; override '_{public}' instead")
    for hook, parameters in HOOKS.items():
        if getattr(guard, hook) is not getattr(Guard, hook):
            _signature(guard, hook, parameters, where)
    _targets(guard, list(guard.targets), where)


def check_targets(guard: Guard, targets: list[Target]) -> None:
    """The targets a guard computes at install time (``_targets_to_wrap``)."""
    where = f"guard {type(guard).__module__}.{type(guard).__qualname__}"
    for target in targets:
        if not isinstance(target, Target):
            raise TypeError(f"{where}: _targets_to_wrap() returned {target!r}, not a Target")
        switch = getattr(guard, target.switch, None) if target.switch else []
        if not isinstance(switch, list):
            raise TypeError(
                f"{where}: target {target} names switch={target.switch!r}, which must be a "
                f"list the guard holds (made in __init__), not {type(switch).__name__}"
            )
    _targets(type(guard), targets, where)


def _targets(guard: type[Guard], targets: list[Target], where: str) -> None:
    """The methods the targets name exist and take what they must; a ``risky`` or
    ``handle`` that no target would use is a mistake (a subclass overriding it)."""
    from autograd_guard._runtime.guard import Guard

    for target in targets:
        _target_methods(guard, target, where)
    for hook, field in (("risky", "check"), ("handle", "handle")):
        overridden = getattr(guard, hook) is not getattr(Guard, hook)
        if overridden and targets and all(getattr(t, field) for t in targets):
            raise TypeError(
                f"{where}: {hook} is never called: every target names its own {field} "
                f"method ({', '.join(sorted({getattr(t, field) for t in targets}))}); "
                "override those instead"
            )


def _declarations(guard: type[Guard], where: str) -> None:
    if not is_name(guard.name):
        raise TypeError(
            f"{where}: name {guard.name!r} must be a policy key (letters, digits, '_' and '-')"
        )
    distribution = guard.distribution
    names = (distribution,) if isinstance(distribution, str) else distribution or ()
    if not isinstance(names, tuple) or not all(isinstance(n, str) and n for n in names):
        raise TypeError(
            f"{where}: distribution {distribution!r} must be None, a name or a tuple of names"
        )
    affected = guard.affected
    if not is_specifier(affected):
        raise TypeError(
            f"{where}: affected {affected!r} must be a version specifier such as "
            "'>=1.3,<1.6' ('' for every version)"
        )
    for attribute in ("symptom", "upstream", "remedy", "rule_action"):
        _expect(guard, attribute, str, "a string", where)
    _expect(guard, "targets", (tuple, list), "a tuple of Target", where, Target)
    _expect(guard, "modules", (tuple, list), "a tuple of module names", where, str)
    for attribute in ("options", "rule_options"):
        table = getattr(guard, attribute)
        if not isinstance(table, dict) or not all(
            isinstance(k, str) and isinstance(v, Option) for k, v in table.items()
        ):
            raise TypeError(f"{where}: {attribute} must be a dict of name -> Option")


def _expect(
    guard: type[Guard],
    attribute: str,
    kind: type | tuple[type, ...],
    allowed: str,
    where: str,
    item: Any = None,
) -> None:
    value = getattr(guard, attribute)
    members: Any = value if isinstance(value, kind) else None  # isinstance narrows to object
    if members is None or (item and not all(isinstance(v, item) for v in members)):
        raise TypeError(f"{where}: {attribute} is {value!r}; it must be {allowed}")


def _signature(guard: type[Guard], name: str, parameters: tuple[str, ...], where: str) -> None:
    """``name`` takes ``self`` and ``parameters`` (by position; ``*args`` accepts any)."""
    function = getattr(guard, name)
    if not callable(function):
        raise TypeError(f"{where}: {name} is {function!r}, not a method")
    code = getattr(function, "__code__", None)
    if code is None or code.co_flags & VARARGS:
        return  # a builtin or a C function: nothing to read cheaply
    # A staticmethod takes no self; a classmethod's cls stands where self would.
    declared = next((c.__dict__[name] for c in guard.__mro__ if name in c.__dict__), None)
    static = isinstance(declared, staticmethod)
    given = len(parameters) + (0 if static else 1)
    taken = code.co_argcount - len(getattr(function, "__defaults__", None) or ())
    if not taken <= given <= code.co_argcount:
        expected = ", ".join(parameters if static else ("self", *parameters))
        found = ", ".join(code.co_varnames[: code.co_argcount])
        raise TypeError(f"{where}: {name}({found}) must take ({expected})")


def _target_methods(guard: type[Guard], target: Target, where: str) -> None:
    for field, parameters in TARGET_METHODS.items():
        method = getattr(target, field)
        if method is None:
            continue
        if not isinstance(method, str) or not hasattr(guard, method):
            raise TypeError(
                f"{where}: target {target} names {field}={method!r}, which is not a method "
                "of the guard"
            )
        _signature(guard, method, parameters, where)
