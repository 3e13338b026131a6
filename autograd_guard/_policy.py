"""Find, read and validate the policy: plain TOML data that never imports or runs code.

Search order: ``AUTOGRAD_GUARD_POLICY`` (a path or a preset name), ``autograd_guard.toml``
in the working directory or a parent, ``[tool.autograd_guard]`` in the nearest
``pyproject.toml``, then the shipped ``default`` preset.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from autograd_guard.errors import PolicyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

    from autograd_guard._guard import Guard

MODES = ("off", "observe", "fix", "strict")
POLICY_FILE = "autograd_guard.toml"
TOP_LEVEL_KEYS = ("extends", "mode", "log", "disable", "guards", "rules")
GUARD_KEYS = ("enabled", "mode", "force")
RULE_KEYS = ("target", "action")
TARGET_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
MAX_STRING = 4096
MAX_LIST = 1024


class Option:
    """One guard- or rule-specific policy key, with its type and allowed values."""

    __slots__ = ("choices", "default", "doc", "kind", "maximum", "minimum")

    def __init__(self, kind: type, default: Any, doc: str = "", *,
                 choices: Sequence[str] = (), minimum: float | None = None,
                 maximum: float | None = None) -> None:
        self.kind = kind
        self.default = default
        self.doc = doc
        self.choices = tuple(choices)
        self.minimum = minimum
        self.maximum = maximum

    def allowed(self) -> str:
        if self.choices:
            return ", ".join(repr(c) for c in self.choices)
        if self.kind is list:
            return "a list of strings"
        name = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
        text = name[self.kind]
        if self.minimum is not None or self.maximum is not None:
            text += f" in [{self.minimum}, {self.maximum}]"
        return text

    def check(self, source: str, key: str, value: Any) -> Any:
        ok = isinstance(value, self.kind) and not (self.kind is not bool and isinstance(value, bool))
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if ok and self.kind is list:
            ok = len(value) <= MAX_LIST and all(
                isinstance(v, str) and 0 < len(v) <= MAX_STRING for v in value)
            value = list(value)
        if ok and self.kind is str:
            ok = len(value) <= MAX_STRING
        if ok and self.choices:
            ok = value in self.choices
        if ok and self.kind in (int, float):
            ok = (self.minimum is None or value >= self.minimum) and (
                self.maximum is None or value <= self.maximum) and value == value
        if not ok:
            raise PolicyError(source, key, f"invalid value {_short(value)}", self.allowed())
        return value


class GuardSettings:
    """What the policy says about one guard."""

    __slots__ = ("enabled", "force", "mode", "name", "options")

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        self.name = name
        self.enabled = True
        self.mode: str | None = None
        self.force = False
        self.options = options


class Rule:
    """A user rule: ``action`` applies to the callable at ``target`` (``module:qualname``)."""

    __slots__ = ("action", "options", "target")

    def __init__(self, target: str, action: str, options: dict[str, Any]) -> None:
        self.target = target
        self.action = action
        self.options = options

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.target.partition(":")[2]


class Policy:
    """A validated policy. ``env_mode`` and ``disabled`` come from the environment."""

    def __init__(self, source: str, mode: str, log: str | None, disabled: set[str],
                 guards: dict[str, GuardSettings], rules: list[Rule]) -> None:
        self.source = source
        self.mode = mode
        self.log = log
        self.disabled = disabled
        self.guards = guards
        self.rules = rules
        self.env_mode: str | None = None

    def mode_for(self, guard: str) -> str:
        """The mode that applies to ``guard``: off, observe, fix or strict."""
        settings = self.guards.get(guard)
        if "*" in self.disabled or guard in self.disabled:
            return "off"
        if settings is not None and (not settings.enabled or settings.mode == "off"):
            return "off"
        if self.env_mode is not None:
            return self.env_mode
        if settings is not None and settings.mode is not None:
            return settings.mode
        return self.mode

    def settings(self, guard: str) -> GuardSettings:
        return self.guards[guard]

    def rules_for(self, action: str) -> list[Rule]:
        return [r for r in self.rules if r.action == action]


# -- discovery -------------------------------------------------------------------------

def presets_dir() -> Path:
    here = Path(__file__).resolve().parent
    shipped = here / "policies"  # inside a wheel
    return shipped if shipped.is_dir() else here.parent / "policies"  # a source checkout


def preset_names() -> list[str]:
    return sorted(p.stem for p in presets_dir().glob("*.toml"))


def discover(environ: Mapping[str, str], cwd: Path) -> tuple[str, Path, bool]:
    """Where the policy comes from: (description, file, is_pyproject)."""
    named = environ.get("AUTOGRAD_GUARD_POLICY", "").strip()
    if named:
        return _resolve_named(named, "AUTOGRAD_GUARD_POLICY")
    pyproject: Path | None = None
    for folder in (cwd, *cwd.parents):
        candidate = folder / POLICY_FILE
        if candidate.is_file():
            return str(candidate), candidate, False
        if pyproject is None and (folder / "pyproject.toml").is_file():
            pyproject = folder / "pyproject.toml"
    if pyproject is not None and _has_tool_table(pyproject):
        return f"{pyproject} [tool.autograd_guard]", pyproject, True
    return "preset default", presets_dir() / "default.toml", False


def _resolve_named(named: str, key: str, relative_to: Path | None = None) -> tuple[str, Path, bool]:
    if re.fullmatch(r"[A-Za-z0-9_-]+", named) and not named.endswith(".toml"):
        path = presets_dir() / f"{named}.toml"
        if not path.is_file():
            raise PolicyError(key, named, "no such preset", ", ".join(preset_names()))
        return f"preset {named}", path, False
    path = Path(named).expanduser()
    if relative_to is not None and not path.is_absolute():
        path = relative_to / path
    return str(path), path, False


def _has_tool_table(pyproject: Path) -> bool:
    try:
        return b"autograd_guard" in pyproject.read_bytes()
    except OSError:
        return False


# -- loading ---------------------------------------------------------------------------

def load(source: str | Path | Mapping[str, Any] | None,
         guards: Iterable[type[Guard]],
         environ: Mapping[str, str] | None = None,
         cwd: Path | None = None) -> Policy:
    """Load and validate a policy, then apply the environment's overrides."""
    environ = os.environ if environ is None else environ
    guard_list = list(guards)
    if isinstance(source, dict):
        policy = _build("<dict>", dict(source), guard_list, depth=0)
    else:
        if source is None:
            description, path, is_pyproject = discover(environ, cwd or Path.cwd())
        else:
            description, path, is_pyproject = _resolve_named(str(source), "policy")
        data = read_toml(description, path, is_pyproject)
        policy = _build(description, data, guard_list, depth=0, folder=path.parent)
    _apply_environment(policy, environ)
    return policy


def read_toml(description: str, path: Path, is_pyproject: bool = False) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PolicyError(description, "", f"cannot read the policy file: {exc.strerror or exc}",
                          "a readable TOML file") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise PolicyError(description, "", f"not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(description, "", f"invalid TOML: {exc}") from None
    if is_pyproject:
        table = data.get("tool", {}).get("autograd_guard", {})
        if not isinstance(table, dict):
            raise PolicyError(description, "tool.autograd_guard", "must be a table")
        return table
    return data


def _build(source: str, data: dict[str, Any], guards: list[type[Guard]], depth: int,
           folder: Path | None = None) -> Policy:
    _check_keys(source, "", data, TOP_LEVEL_KEYS)
    if "extends" in data:
        base = _load_base(source, data["extends"], guards, depth, folder)
    else:
        base = Policy(source, "fix", None, set(), _default_settings(guards), [])
    base.source = source
    if "mode" in data:
        base.mode = _choice(source, "mode", data["mode"], MODES)
    if "log" in data:
        base.log = Option(str, None).check(source, "log", data["log"]) or None
    known = [g.name for g in guards]
    if "disable" in data:
        names = Option(list, []).check(source, "disable", data["disable"])
        for name in names:
            if name != "*" and name not in known:
                raise PolicyError(source, "disable", f"unknown guard {name!r}",
                                  ", ".join(["*", *known]))
        base.disabled |= set(names)
    if "guards" in data:
        _merge_guards(source, data["guards"], guards, base.guards)
    if "rules" in data:
        base.rules += _parse_rules(source, data["rules"], guards)
    return base


def _load_base(source: str, extends: Any, guards: list[type[Guard]], depth: int,
               folder: Path | None) -> Policy:
    name = Option(str, None).check(source, "extends", extends)
    if depth >= 8:
        raise PolicyError(source, "extends", "chain is too deep (a loop?)", "at most 8 levels")
    description, path, _ = _resolve_named(name, f"{source}: extends", folder)
    data = read_toml(description, path)
    return _build(description, data, guards, depth + 1, path.parent)


def _default_settings(guards: list[type[Guard]]) -> dict[str, GuardSettings]:
    return {g.name: GuardSettings(g.name, {k: o.default for k, o in g.options.items()})
            for g in guards}


def _merge_guards(source: str, table: Any, guards: list[type[Guard]],
                  into: dict[str, GuardSettings]) -> None:
    if not isinstance(table, dict):
        raise PolicyError(source, "guards", "must be a table of guard tables")
    by_name = {g.name: g for g in guards}
    for name, entry in table.items():
        key = f"guards.{name}"
        if name not in by_name:
            raise PolicyError(source, key, "unknown guard", ", ".join(by_name))
        if not isinstance(entry, dict):
            raise PolicyError(source, key, "must be a table")
        guard = by_name[name]
        _check_keys(source, key, entry, (*GUARD_KEYS, *guard.options))
        settings = into[name]
        for option, value in entry.items():
            where = f"{key}.{option}"
            if option == "enabled":
                settings.enabled = Option(bool, True).check(source, where, value)
            elif option == "force":
                settings.force = Option(bool, False).check(source, where, value)
            elif option == "mode":
                settings.mode = _choice(source, where, value, MODES)
            else:
                settings.options[option] = guard.options[option].check(source, where, value)


def _parse_rules(source: str, rules: Any, guards: list[type[Guard]]) -> list[Rule]:
    if not isinstance(rules, list) or len(rules) > MAX_LIST:
        raise PolicyError(source, "rules", "must be an array of tables ([[rules]])",
                          f"at most {MAX_LIST} rules")
    actions = {g.rule_action: g for g in guards if g.rule_action}
    parsed = []
    for index, rule in enumerate(rules):
        key = f"rules[{index}]"
        if not isinstance(rule, dict):
            raise PolicyError(source, key, "must be a table with 'target' and 'action'")
        action = _choice(source, f"{key}.action", rule.get("action"), tuple(actions))
        guard = actions[action]
        _check_keys(source, key, rule, (*RULE_KEYS, *guard.rule_options))
        target = rule.get("target")
        if not isinstance(target, str) or len(target) > MAX_STRING or not TARGET_PATTERN.match(
                target):
            raise PolicyError(source, f"{key}.target", f"invalid target {_short(target)}",
                              "'package.module:function' or 'package.module:Class.method'")
        options = {k: o.default for k, o in guard.rule_options.items()}
        for option, value in rule.items():
            if option not in RULE_KEYS:
                options[option] = guard.rule_options[option].check(
                    source, f"{key}.{option}", value)
        parsed.append(Rule(target, action, options))
    return parsed


def _apply_environment(policy: Policy, environ: Mapping[str, str]) -> None:
    from autograd_guard._bootstrap import OFF_VALUES

    value = environ.get("AUTOGRAD_GUARD", "").strip().lower()
    if value in MODES:
        policy.env_mode = value
    elif value not in ("1", "true", "on", "yes") and value not in OFF_VALUES:
        raise PolicyError("AUTOGRAD_GUARD", "", f"invalid value {_short(value)}",
                          "1, on, true, yes, observe, fix, strict, or 0/off/empty to disable")
    disabled = environ.get("AUTOGRAD_GUARD_DISABLE", "")
    policy.disabled |= {n.strip() for n in disabled.split(",") if n.strip()}
    log = environ.get("AUTOGRAD_GUARD_LOG", "").strip()
    if log:
        policy.log = log


def _check_keys(source: str, where: str, table: dict[str, Any], allowed: Sequence[str]) -> None:
    for key in table:
        if key not in allowed:
            name = f"{where}.{key}" if where else str(key)
            raise PolicyError(source, name, "unknown key", ", ".join(allowed))


def _choice(source: str, key: str, value: Any, choices: Sequence[str]) -> str:
    return str(Option(str, None, choices=choices).check(source, key, value))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
