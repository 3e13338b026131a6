"""Find, read and validate the policy: plain TOML data that never imports or runs code.

Search order: ``AUTOGRAD_GUARD_POLICY`` (a path or a preset name), ``autograd_guard.toml``
in the working directory or a parent, ``[tool.autograd_guard]`` in the nearest
``pyproject.toml``, then the shipped ``default`` preset.
"""

from __future__ import annotations

import marshal
import os

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
MAX_STRING = 4096
MAX_LIST = 1024
MAX_POLICY_BYTES = 1 << 20


class Option:
    """One guard- or rule-specific policy key, with its type and allowed values."""

    __slots__ = ("choices", "default", "doc", "items", "kind", "maximum", "minimum")

    def __init__(
        self,
        kind: type,
        default: Any,
        doc: str = "",
        *,
        choices: Sequence[str] = (),
        minimum: float | None = None,
        maximum: float | None = None,
        items: tuple[type, ...] = (str,),
    ) -> None:
        self.kind = kind
        self.items = items  # what a list may hold: strings, or also positions (int)
        self.default = default
        self.doc = doc
        self.choices = tuple(choices)
        self.minimum = minimum
        self.maximum = maximum

    def allowed(self) -> str:
        if self.choices:
            return ", ".join(repr(c) for c in self.choices)
        if self.kind is list:
            return "a list of names or positions" if int in self.items else "a list of strings"
        name = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
        text = name[self.kind]
        if self.minimum is not None or self.maximum is not None:
            text += f" in [{self.minimum}, {self.maximum}]"
        return text

    def check(self, source: str, key: str, value: Any) -> Any:
        is_bool = isinstance(value, bool)
        ok = isinstance(value, self.kind) and not (self.kind is not bool and is_bool)
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if ok and self.kind is list:
            ok = len(value) <= MAX_LIST and all(self._item_ok(v) for v in value)
            value = list(value)
        if ok and self.kind is str:
            ok = len(value) <= MAX_STRING
        if ok and self.choices:
            ok = value in self.choices
        if ok and self.kind in (int, float):
            ok = (
                (self.minimum is None or value >= self.minimum)
                and (self.maximum is None or value <= self.maximum)
                and value == value
            )
        if not ok:
            raise PolicyError(source, key, f"invalid value {_short(value)}", self.allowed())
        return value

    def _item_ok(self, value: Any) -> bool:
        if isinstance(value, str):
            return str in self.items and 0 < len(value) <= MAX_STRING
        if isinstance(value, int) and not isinstance(value, bool):
            return int in self.items and 0 <= value <= MAX_LIST
        return False


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

    __slots__ = ("action", "key", "options", "origin", "target")

    def __init__(
        self,
        target: str,
        action: str,
        options: dict[str, Any],
        origin: str = "<dict>",
        key: str = "rules",
    ) -> None:
        self.target = target
        self.action = action
        self.options = options
        self.origin = origin  # the policy file (or preset) that holds the rule
        self.key = key  # "rules[3]" in that file

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.target.partition(":")[2]


class Policy:
    """A validated policy. ``env_mode`` and ``disabled`` come from the environment."""

    def __init__(
        self,
        source: str,
        mode: str,
        log: str | None,
        disabled: set[str],
        guards: dict[str, GuardSettings],
        rules: list[Rule],
    ) -> None:
        self.source = source
        self.mode = mode
        self.log = log
        self.disabled = disabled
        self.guards = guards
        self.rules = rules
        self.env_mode: str | None = None
        self.log_source = "AUTOGRAD_GUARD_LOG"  # where ``log`` was set, for messages

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


# -- discovery ----------------------------------------------------------------------
# Start-up runs this code, so it sticks to os.path: pathlib and re cost milliseconds.


def presets_dir() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    shipped = os.path.join(here, "policies")  # inside a wheel
    return shipped if os.path.isdir(shipped) else os.path.join(os.path.dirname(here), "policies")


def preset_names() -> list[str]:
    return sorted(n[:-5] for n in os.listdir(presets_dir()) if n.endswith(".toml"))


def discover(environ: Mapping[str, str], cwd: str) -> tuple[str, str, bool]:
    """Where the policy comes from: (description, file, is_pyproject)."""
    named = environ.get("AUTOGRAD_GUARD_POLICY", "").strip()
    if named:
        return _resolve_named(named, "AUTOGRAD_GUARD_POLICY")
    pyproject: str | None = None
    folder = os.path.abspath(cwd)
    while True:
        candidate = os.path.join(folder, POLICY_FILE)
        if os.path.isfile(candidate):
            return candidate, candidate, False
        if os.path.islink(candidate):
            raise PolicyError(
                candidate,
                "",
                f"a symbolic link to {os.readlink(candidate)!r}, which does not exist",
                "a policy file: fix or remove the link",
            )
        if pyproject is None and os.path.isfile(os.path.join(folder, "pyproject.toml")):
            pyproject = os.path.join(folder, "pyproject.toml")
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    if pyproject is not None and _has_tool_table(pyproject):
        return f"{pyproject} [tool.autograd_guard]", pyproject, True
    return "preset default", os.path.join(presets_dir(), "default.toml"), False


def _is_preset_name(named: str) -> bool:
    return named.replace("-", "_").isidentifier() and not named.endswith(".toml")


def _resolve_named(named: str, key: str, relative_to: str | None = None) -> tuple[str, str, bool]:
    if _is_preset_name(named):
        path = os.path.join(presets_dir(), f"{named}.toml")
        if not os.path.isfile(path):
            raise PolicyError(key, named, "no such preset", ", ".join(preset_names()))
        return f"preset {named}", path, False
    path = os.path.expanduser(named)
    if relative_to is not None and not os.path.isabs(path):
        path = os.path.join(relative_to, path)
    return path, path, False


def _has_tool_table(pyproject: str) -> bool:
    """A line opening ``[tool.autograd_guard...]`` or setting ``tool.autograd_guard.*``;
    checked on the bytes, so that a pyproject.toml without it is never parsed."""
    try:
        with open(pyproject, "rb") as f:
            lines = f.read(MAX_POLICY_BYTES).removeprefix(b"\xef\xbb\xbf").splitlines()
    except OSError:
        return False
    return any(
        line.lstrip().startswith((b"[tool.autograd_guard", b"tool.autograd_guard."))
        for line in lines
    )


def is_target(text: object) -> bool:
    """``package.module:qualname``, every part an identifier."""
    if not isinstance(text, str) or len(text) > MAX_STRING or text.count(":") != 1:
        return False
    module, qualname = text.split(":")
    return all(p.isidentifier() for p in (*module.split("."), *qualname.split(".")))


# -- loading ---------------------------------------------------------------------------


def load(
    source: str | Mapping[str, Any] | None,
    guards: Iterable[type[Guard]],
    environ: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> Policy:
    """Load and validate a policy, then apply the environment's overrides."""
    environ = os.environ if environ is None else environ
    guard_list = list(guards)
    if isinstance(source, dict):
        policy = _build("<dict>", dict(source), guard_list, depth=0)
    else:
        if source is None:
            description, path, is_pyproject = discover(environ, cwd or os.getcwd())
        else:
            description, path, is_pyproject = _resolve_named(str(source), "policy")
        data = read_toml(description, path, is_pyproject)
        policy = _build(description, data, guard_list, depth=0, folder=os.path.dirname(path))
    _apply_environment(policy, environ)
    return policy


def read_toml(description: str, path: str, is_pyproject: bool = False) -> dict[str, Any]:
    """The policy table in ``path``; parsed TOML is cached (see ``_ParseCache``)."""
    raw = _read_policy_bytes(description, path)
    cache = _ParseCache.shared()
    data = cache.get(path, raw)
    if data is None:
        data = _parse(description, raw, is_pyproject)
        cache.put(path, raw, data)
    return data


def _read_policy_bytes(description: str, path: str) -> bytes:
    """The file's bytes; never blocks or reads without end (a FIFO, ``/dev/zero``)."""
    import stat

    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise PolicyError(description, "", "not a regular file", "a TOML file")
        if info.st_size > MAX_POLICY_BYTES:
            raise PolicyError(
                description, "", f"{info.st_size} bytes", f"at most {MAX_POLICY_BYTES} bytes"
            )
        with open(path, "rb") as f:
            raw = f.read(MAX_POLICY_BYTES + 1)
    except PolicyError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        why = getattr(exc, "strerror", None) or str(exc)
        raise PolicyError(
            description, "", f"cannot read the policy file: {why}", "a readable TOML file"
        ) from None
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(description, "", "too large", f"at most {MAX_POLICY_BYTES} bytes")
    return raw


def _parse(description: str, raw: bytes, is_pyproject: bool) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef, import-not-found, unused-ignore]
    try:
        data = tomllib.loads(raw.decode("utf-8-sig"))  # a byte-order mark is fine
    except UnicodeDecodeError as exc:
        raise PolicyError(description, "", f"not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(description, "", f"invalid TOML: {exc}") from None
    if is_pyproject:
        tool = data.get("tool", {})
        table = tool.get("autograd_guard", {}) if isinstance(tool, dict) else {}
        if not isinstance(table, dict):
            raise PolicyError(description, "tool.autograd_guard", "must be a table")
        return table
    return data


class _ParseCache:
    """Parsed policy files, keyed by path and checked against the exact bytes.

    Importing tomllib costs ~4 ms, most of the start-up budget, so the parsed tables are
    kept in one ``marshal`` file (data only: marshal cannot run code) under
    ``$XDG_CACHE_HOME/autograd-guard``. ``AUTOGRAD_GUARD_CACHE=off`` turns it off.
    """

    MAX_ENTRIES = 32
    _shared: _ParseCache | None = None

    def __init__(self, folder: str | None) -> None:
        self.file = os.path.join(folder, "policies.marshal") if folder else None
        self.entries: dict[str, tuple[bytes, dict[str, Any]]] | None = None

    @classmethod
    def shared(cls) -> _ParseCache:
        if cls._shared is None:
            cls._shared = cls(_cache_folder(os.environ))
        return cls._shared

    def get(self, path: str, raw: bytes) -> dict[str, Any] | None:
        """The data stored for ``path`` (a file, or a ``<name>`` of our own) if ``raw``
        is still what it was."""
        entry = self._load().get(_cache_key(path))
        if entry is not None and entry[0] == raw:
            return entry[1]
        return None

    def put(self, path: str, raw: bytes, data: dict[str, Any]) -> None:
        entries = self._load()
        entries[_cache_key(path)] = (raw, data)
        while len(entries) > self.MAX_ENTRIES:
            del entries[next(iter(entries))]
        if self.file is None:
            return
        try:  # best effort: a read-only home only costs the parse next time
            os.makedirs(os.path.dirname(self.file), exist_ok=True)
            temporary = f"{self.file}.{os.getpid()}.tmp"
            with open(temporary, "wb") as f:
                marshal.dump(entries, f)
            os.replace(temporary, self.file)
        except (OSError, ValueError):
            pass

    def _load(self) -> dict[str, tuple[bytes, dict[str, Any]]]:
        if self.entries is None:
            self.entries = {}
            if self.file is not None:
                try:
                    with open(self.file, "rb") as f:
                        loaded = marshal.load(f)
                    if isinstance(loaded, dict):
                        self.entries = {k: v for k, v in loaded.items() if _valid_entry(k, v)}
                except (OSError, EOFError, ValueError, TypeError):
                    pass
        return self.entries


def _cache_key(path: str) -> str:
    return path if path.startswith("<") else os.path.abspath(path)


def _valid_entry(key: object, value: object) -> bool:
    return (
        isinstance(key, str)
        and isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], bytes)
        and isinstance(value[1], dict)
    )


def _cache_folder(environ: Mapping[str, str]) -> str | None:
    if environ.get("AUTOGRAD_GUARD_CACHE", "").strip().lower() in ("0", "off", "false", "no"):
        return None
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "autograd-guard")


def _build(
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
        description, path, _ = _resolve_named(name, "extends", folder)
        data = read_toml(description, path)
    except PolicyError as exc:
        raise PolicyError(source, "extends", f"cannot use {name!r}: {exc}") from None
    return _build(description, data, guards, depth + 1, os.path.dirname(path))


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
                f"invalid target {_short(target)}",
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


def _apply_environment(policy: Policy, environ: Mapping[str, str]) -> None:
    from autograd_guard._bootstrap import OFF_VALUES

    value = environ.get("AUTOGRAD_GUARD", "").strip().lower()
    if value in MODES:
        policy.env_mode = value
    elif value not in ("1", "true", "on", "yes") and value not in OFF_VALUES:
        raise PolicyError(
            "AUTOGRAD_GUARD",
            "",
            f"invalid value {_short(value)}",
            "1, on, true, yes, observe, fix, strict, or 0/off/empty to disable",
        )
    disabled = environ.get("AUTOGRAD_GUARD_DISABLE", "")
    policy.disabled |= {n.strip() for n in disabled.split(",") if n.strip()}
    log = environ.get("AUTOGRAD_GUARD_LOG", "").strip()
    if log:
        policy.log, policy.log_source = log, "AUTOGRAD_GUARD_LOG"


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
