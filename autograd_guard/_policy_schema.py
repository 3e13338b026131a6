"""Turn policy data (a TOML table or a dict) into a validated ``Policy``: keys, values,
``extends``, guard tables, rules and the environment's overrides. Every error names the
file, the key and what is allowed."""

from __future__ import annotations

import os

from autograd_guard import _environment, _policy_files
from autograd_guard._environment import MODES
from autograd_guard._options import MAX_LIST, MAX_STRING, Option, short
from autograd_guard._policy import GuardSettings, Policy, Rule
from autograd_guard.errors import PolicyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from autograd_guard._guard import Guard

TOP_LEVEL_KEYS = ("extends", "mode", "log", "disable", "guards", "rules")
GUARD_KEYS = ("enabled", "mode", "force")
RULE_KEYS = ("target", "action")


def is_target(text: object) -> bool:
    """``package.module:qualname``, every part an identifier."""
    if not isinstance(text, str) or len(text) > MAX_STRING or text.count(":") != 1:
        return False
    module, qualname = text.split(":")
    return all(p.isidentifier() for p in (*module.split("."), *qualname.split(".")))


def build(
    source: str,
    data: dict[str, Any],
    guards: list[type[Guard]],
    depth: int,
    folder: str | None = None,
) -> Policy:
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
        base.log_source = f"the 'log' key of {source}"
    known = [g.name for g in guards]
    if "disable" in data:
        names = Option(list, []).check(source, "disable", data["disable"])
        for name in names:
            if name != "*" and name not in known:
                raise PolicyError(
                    source, "disable", f"unknown guard {name!r}", ", ".join(["*", *known])
                )
        base.disabled |= set(names)
    if "guards" in data:
        _merge_guards(source, data["guards"], guards, base.guards)
    if "rules" in data:
        base.rules += _parse_rules(source, data["rules"], guards)
    return base


def _load_base(
    source: str, extends: Any, guards: list[type[Guard]], depth: int, folder: str | None
) -> Policy:
    name = Option(str, None).check(source, "extends", extends)
    if not name.strip():
        raise PolicyError(source, "extends", "empty", "a preset name or a policy file path")
    if depth >= 8:
        raise PolicyError(source, "extends", "chain is too deep (a loop?)", "at most 8 levels")
    try:
        description, path, _ = _policy_files.resolve_named(name, "extends", folder)
        data = _policy_files.read_toml(description, path)
    except PolicyError as exc:
        raise PolicyError(source, "extends", f"cannot use {name!r}: {exc}") from None
    return build(description, data, guards, depth + 1, os.path.dirname(path))


def _default_settings(guards: list[type[Guard]]) -> dict[str, GuardSettings]:
    return {
        g.name: GuardSettings(g.name, {k: o.default for k, o in g.options.items()}) for g in guards
    }


def _merge_guards(
    source: str, table: Any, guards: list[type[Guard]], into: dict[str, GuardSettings]
) -> None:
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
        raise PolicyError(
            source, "rules", "must be an array of tables ([[rules]])", f"at most {MAX_LIST} rules"
        )
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
        if not is_target(target):
            raise PolicyError(
                source,
                f"{key}.target",
                f"invalid target {short(target)}",
                "'package.module:function' or 'package.module:Class.method'",
            )
        _check_target_module(source, f"{key}.target", str(target))
        options = {k: o.default for k, o in guard.rule_options.items()}
        for option, value in rule.items():
            if option not in RULE_KEYS:
                options[option] = guard.rule_options[option].check(source, f"{key}.{option}", value)
        parsed.append(Rule(str(target), action, options, source, key))
    return parsed


def _check_target_module(source: str, key: str, target: str) -> None:
    """Refuse targets a policy must not reach: the policy file can come with any checkout."""
    import sys

    top = target.partition(":")[0].partition(".")[0]
    if top == "__main__":
        raise PolicyError(
            source,
            key,
            f"{target!r} is in the script being run, whose functions are defined and called "
            "before any import could wrap them",
            "a function in an importable module: move the stage into one",
        )
    if top in sys.stdlib_module_names or top == "autograd_guard":
        raise PolicyError(
            source,
            key,
            f"{target!r} belongs to Python itself (module {top!r}); rules never patch the "
            "standard library or builtins",
            "a function of your own code or of a third-party library",
        )


def apply_environment(policy: Policy, environ: Mapping[str, str]) -> None:
    value = _environment.switch(environ)
    if value in MODES:
        policy.env_mode = value
    elif value not in _environment.ON_VALUES | _environment.OFF_VALUES:
        raise PolicyError(
            "AUTOGRAD_GUARD",
            "",
            f"invalid value {short(value)}",
            "1, on, true, yes, observe, fix, strict, or 0/off/empty to disable",
        )
    policy.disabled |= _environment.disabled(environ)
    log = _environment.log(environ)
    if log:
        policy.log, policy.log_source = log, "AUTOGRAD_GUARD_LOG"


def _check_keys(source: str, where: str, table: dict[str, Any], allowed: Sequence[str]) -> None:
    for key in table:
        if key not in allowed:
            name = f"{where}.{key}" if where else str(key)
            raise PolicyError(source, name, "unknown key", ", ".join(allowed))


def _choice(source: str, key: str, value: Any, choices: Sequence[str]) -> str:
    return str(Option(str, None, choices=choices).check(source, key, value))
