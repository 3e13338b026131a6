"""Turn policy data (a TOML table or a dict) into a validated ``Policy``: keys, values,
``extends``, guard tables, rules and the environment's overrides. Every problem is
collected (not only the first) and names the file, the key, what is allowed and, for a
typo, the closest allowed word."""

from __future__ import annotations

import os

from autograd_guard._common import environment as _environment
from autograd_guard._common.environment import MODES, as_mode
from autograd_guard._policy import files as _policy_files
from autograd_guard._policy.data import GuardSettings, Policy, Rule
from autograd_guard._policy.options import MAX_LIST, MAX_STRING, Option, log_destination, short
from autograd_guard.errors import PolicyError, Problems, closest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

    from autograd_guard._common.environment import Mode
    from autograd_guard._policy.options import GuardOptions, Guards

TOP_LEVEL_KEYS = ("extends", "mode", "log", "disable", "guards", "rules")
GUARD_KEYS = ("enabled", "mode", "force")
RULE_KEYS = ("target", "action")
_TARGET_FORM = "'package.module:function' or 'package.module:Class.method'"


def is_target(text: object) -> bool:
    """``package.module:qualname``, every part an identifier."""
    if not isinstance(text, str) or len(text) > MAX_STRING or text.count(":") != 1:
        return False
    module, qualname = text.split(":")
    return all(p.isidentifier() for p in (*module.split("."), *qualname.split(".")))


def build(
    source: str,
    data: dict[str, Any],
    guards: Guards,
    problems: Problems,
    files: list[str],
    depth: int = 0,
    folder: str | None = None,
) -> Policy:
    """The policy ``data`` describes; every problem goes to ``problems`` and the key in
    question keeps its default, so that the rest is still checked."""
    _check_keys(problems, source, "", data, TOP_LEVEL_KEYS)
    base = None
    if "extends" in data:
        base = problems.attempt(
            _load_base, source, data["extends"], guards, problems, files, depth, folder
        )
    if base is None:
        base = Policy(source, "fix", None, set(), _default_settings(guards), [])
    base.source = source
    if "mode" in data:
        base.mode = problems.attempt(_mode, source, "mode", data["mode"]) or base.mode
    if "log" in data:
        log = problems.attempt(log_destination, source, "log", data["log"])
        if log and folder is not None and log not in ("stderr", "logging"):
            log = os.path.join(folder, log)  # a path is the policy file's, as ruff's are
        if log is not None:
            base.log, base.log_source = log or None, f"the 'log' key of {source}"
    if "disable" in data:
        base.disabled |= _disabled(problems, source, data["disable"], guards, base.warnings)
    if "guards" in data:
        problems.attempt(_merge_guards, source, data["guards"], guards, base, problems)
    if "rules" in data:
        base.rules += problems.attempt(_parse_rules, source, data["rules"], guards, problems) or []
    return base


def _disabled(
    problems: Problems, source: str, value: Any, guards: Guards, warnings: list[Any]
) -> set[str]:
    names = problems.attempt(Option(list, []).check, source, "disable", value) or []
    known = ["*", *(g.name for g in guards)]
    names = [_keyword(name, known) for name in names]
    unknown = [name for name in dict.fromkeys(names) if name not in known]
    warnings += [absent(source, "disable", name, known) for name in unknown]
    return {name for name in names if name in known}


def absent(source: str, key: str, name: str, known: Sequence[str]) -> PolicyError:
    """A guard to switch off that is not installed: a warning (it is off, as asked)."""
    text = f"unknown guard {name!r}, ignored"
    return PolicyError(source, key, text, ", ".join(known), closest(name, known))


def _load_base(
    source: str,
    extends: Any,
    guards: Guards,
    problems: Problems,
    files: list[str],
    depth: int,
    folder: str | None,
) -> Policy:
    name = Option(str, None).check(source, "extends", extends)
    if not name.strip():
        raise PolicyError(source, "extends", "empty", "a preset name or a policy file path")
    if depth >= 8:
        raise PolicyError(source, "extends", "chain is too deep (a loop?)", "at most 8 levels")
    try:
        found = _policy_files.resolve_named(name, "extends", folder)
    except PolicyError as exc:  # said once, as this file's problem
        raise PolicyError(source, "extends", exc.problem, exc.allowed, exc.suggestion) from None
    try:
        data = found.read(files)
    except PolicyError as exc:
        raise PolicyError(
            source, "extends", f"cannot use {name!r}: {exc.problem}", exc.allowed
        ) from None
    folder = os.path.dirname(found.path)
    return build(found.description, data, guards, problems, files, depth + 1, folder)


def _default_settings(guards: Guards) -> dict[str, GuardSettings]:
    return {
        g.name: GuardSettings(g.name, {k: o.default for k, o in g.options.items()}) for g in guards
    }


def _merge_guards(
    source: str,
    table: Any,
    guards: Guards,
    into: Policy,
    problems: Problems,
) -> None:
    """An absent guard's table is an error (it cannot take effect) but ``enabled = false``."""
    if not isinstance(table, dict):
        raise PolicyError(source, "guards", "must be a table of guard tables")
    by_name = {g.name: g for g in guards}
    for name, entry in table.items():
        key = f"guards.{name}"
        if name not in by_name and entry == {"enabled": False} and entry["enabled"] is False:
            into.warnings.append(absent(source, key, name, list(by_name)))
        elif name not in by_name:
            problems.add(source, key, "unknown guard", ", ".join(by_name), closest(name, by_name))
        elif not isinstance(entry, dict):
            problems.add(source, key, "must be a table")
        else:
            _merge_guard(source, key, entry, by_name[name], into.guards[name], problems)


def _merge_guard(
    source: str,
    key: str,
    entry: dict[str, Any],
    guard: type[GuardOptions],
    settings: GuardSettings,
    problems: Problems,
) -> None:
    _check_keys(problems, source, key, entry, (*GUARD_KEYS, *guard.options))
    for option, value in entry.items():
        where = f"{key}.{option}"
        if option == "enabled":
            enabled = problems.attempt(Option(bool, True).check, source, where, value)
            settings.enabled = settings.enabled if enabled is None else enabled
        elif option == "force":
            settings.force = bool(problems.attempt(Option(bool, False).check, source, where, value))
        elif option == "mode":
            settings.mode = problems.attempt(_mode, source, where, value) or settings.mode
        elif option in guard.options:
            checked = problems.attempt(guard.options[option].check, source, where, value)
            if checked is not None:
                settings.options[option] = checked


def _parse_rules(source: str, rules: Any, guards: Guards, problems: Problems) -> list[Rule]:
    if not isinstance(rules, list) or len(rules) > MAX_LIST:
        raise PolicyError(
            source, "rules", "must be an array of tables ([[rules]])", f"at most {MAX_LIST} rules"
        )
    actions = {g.rule_action: g for g in guards if g.rule_action}
    parsed = []
    for index, rule in enumerate(rules):
        key = f"rules[{index}]"
        if not isinstance(rule, dict):
            problems.add(source, key, "must be a table with 'target' and 'action'")
            continue
        if "target" not in rule:
            problems.add(source, f"{key}.target", "missing", _TARGET_FORM)
        if "action" not in rule:
            problems.add(source, f"{key}.action", "missing", ", ".join(map(repr, actions)))
        action = (
            None
            if "action" not in rule
            else problems.attempt(_choice, source, f"{key}.action", rule.get("action"), actions)
        )
        target = (
            None
            if "target" not in rule
            else problems.attempt(_target, source, f"{key}.target", rule.get("target"))
        )
        if action is None:
            continue  # its options depend on the action
        guard = actions[action]
        _check_keys(problems, source, key, rule, (*RULE_KEYS, *guard.rule_options))
        options = {k: o.default for k, o in guard.rule_options.items()}
        for option, value in rule.items():
            if option in guard.rule_options:
                checked = problems.attempt(
                    guard.rule_options[option].check, source, f"{key}.{option}", value
                )
                options[option] = options[option] if checked is None else checked
        if target is not None:
            parsed.append(Rule(target, action, options, source, key))
    return parsed


def _target(source: str, key: str, target: Any) -> str:
    if not is_target(target):
        raise PolicyError(source, key, f"invalid target {short(target)}", _TARGET_FORM)
    _check_target_module(source, key, target)
    return str(target)


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
    if top == "autograd_guard":
        raise PolicyError(
            source, key, f"{target!r} is autograd-guard's own code", "a function of your code"
        )
    if top in sys.stdlib_module_names:
        raise PolicyError(
            source,
            key,
            f"{target!r} belongs to Python itself (module {top!r}); rules never patch the "
            "standard library or builtins",
            "a function of your own code or of a third-party library",
        )


def apply_environment(
    policy: Policy, environ: Mapping[str, str], guard_names: list[str], problems: Problems
) -> None:
    """The variables' overrides. An unknown guard in ``AUTOGRAD_GUARD_DISABLE`` is a
    warning, not an error: the other guards keep running."""
    value = _environment.switch(environ)
    if value in MODES:
        policy.env_mode = as_mode(value)
    elif value not in _environment.ON_VALUES | _environment.OFF_VALUES:
        meant = closest(value, [*MODES, *_environment.ON_VALUES])
        ignored = f", ignored: the guard is on in the policy's modes (mode {policy.mode})"
        problems.add(
            _environment.AUTOGRAD_GUARD,
            "",
            f"invalid value {short(value)}{'' if meant == 'strict' else ignored}",
            "1, on, true, yes, observe, fix, strict, or 0/off/empty to disable",
            meant,
        )
    known = ["*", *guard_names]
    disabled = {_keyword(name, known) for name in _environment.disabled(environ)}
    variable = _environment.AUTOGRAD_GUARD_DISABLE
    policy.warnings += [absent(variable, "", n, known) for n in sorted(disabled - set(known))]
    policy.disabled |= disabled
    log = _environment.log(environ)
    variable = _environment.AUTOGRAD_GUARD_LOG
    if log and problems.attempt(log_destination, variable, "", log) is not None:
        policy.log, policy.log_source = log, variable
    elif log:  # a near miss of a keyword: the events still reach stderr
        policy.log, policy.log_source = None, "default"


def _check_keys(
    problems: Problems, source: str, where: str, table: dict[str, Any], allowed: Sequence[str]
) -> None:
    for key in table:
        if key not in allowed:
            name = f"{where}.{key}" if where else str(key)
            problems.add(source, name, "unknown key", ", ".join(allowed), closest(key, allowed))


def _keyword(word: str, known: Sequence[str]) -> str:
    """``word`` as the known name it spells in any case (``Grad_Mode``), else as is."""
    return next((name for name in known if name.lower() == word.lower()), word)


def _choice(source: str, key: str, value: Any, choices: Iterable[str]) -> str:
    return str(Option(str, None, choices=tuple(choices)).check(source, key, value))


def _mode(source: str, key: str, value: Any) -> Mode:
    return as_mode(_choice(source, key, value, MODES)) or "off"  # _choice raises first
