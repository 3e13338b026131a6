"""The generated sections of the hand-written docs pages, between
``<!-- generated: NAME -->`` and ``<!-- end of generated: NAME -->``: the policy keys (from
``autograd_guard._policy.schema``), the shipped presets (``policies/*.toml``, each one's
first line), the environment variables (``autograd_guard._common.environment.VARIABLES``
and their docstrings), a guard's options (``options:NAME``) and the version-matrix table
(the one ``nox -s table`` writes into the README). Used by ``docs/hooks.py``."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(
    r"<!-- generated: ([\w:-]+) -->\n.*?<!-- end of generated: \1 -->", flags=re.DOTALL
)
# The top-level policy keys and a guard table's own keys, described once here; the build
# fails where the schema gains or loses a key that this list does not.
TOP_LEVEL = {
    "extends": "a preset name ({presets}) or a policy file path, relative to this file; "
    "its settings come first and this file's are merged over them",
    "mode": "`off`, `observe` (log only), `fix` (remedy and log) or `strict` (raise)",
    "log": "`stderr` (a short first line per event, details indented below), `logging` "
    "(the `autograd_guard` logger) or a file path (JSON lines), relative to this file "
    "(`AUTOGRAD_GUARD_LOG`'s, to the working directory)",
    "disable": 'a list of guard names to switch off, or `["*"]`',
    "guards": "one table per guard, `[guards.NAME]`: the keys below and the guard's options",
    "rules": "an array of tables, `[[rules]]`, each naming a `target` "
    "(`package.module:qualname`) and an `action`",
}
GUARD_TABLE = {
    "enabled": "`false` switches the guard off",
    "mode": "the guard's own mode",
    "force": "`true`: patch whatever version is installed",
}


def code(text: str) -> str:
    """reStructuredText literals (````x````) as Markdown ones."""
    return text.replace("``", "`")


def options_table(options: dict[str, Any]) -> list[str]:
    rows = ["| option | default | allowed | meaning |", "|---|---|---|---|"]
    for name, option in options.items():
        default = _toml(option.default)
        rows.append(f"| `{name}` | `{default}` | {option.allowed()} | {option.doc} |")
    return rows


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def guard_options(guards: list[Any], name: str, where: str) -> str:
    by_name = {guard.name: guard for guard in guards}
    if name not in by_name:
        raise ValueError(f"{where}: no guard {name!r} (guards: {', '.join(by_name)})")
    return "\n".join(options_table(by_name[name].options))


def policy_keys(guards: list[Any]) -> str:
    from autograd_guard._policy import schema

    _same_keys("top-level", TOP_LEVEL, schema.TOP_LEVEL_KEYS)
    _same_keys("guard table", GUARD_TABLE, schema.GUARD_KEYS)
    lines = ["| key | value |", "|---|---|"]
    names = ", ".join(f"`{name}`" for name in _policy_files().preset_names())
    described = {key: text.replace("{presets}", names) for key, text in TOP_LEVEL.items()}
    lines += [f"| `{key}` | {described[key]} |" for key in schema.TOP_LEVEL_KEYS]
    lines += ["", "Every `[guards.NAME]` table takes:", "", "| key | value |", "|---|---|"]
    lines += [f"| `{key}` | {GUARD_TABLE[key]} |" for key in schema.GUARD_KEYS]
    lines += ["", "and the guard's own options:", ""]
    for guard in guards:
        if guard.options:
            lines += [f"`[guards.{guard.name}]`", "", *options_table(guard.options), ""]
    for guard in guards:
        if guard.rule_action:
            lines.append(f'`[[rules]]` with `action = "{guard.rule_action}"` ({guard.name}):')
            lines.append("")
            options = guard.rule_options
            keys = [*schema.RULE_KEYS, *options]
            lines += [", ".join(f"`{k}`" for k in keys) + ".", ""]
            if options:
                lines += [*options_table(options), ""]
    return "\n".join(lines)


def _policy_files() -> Any:
    from autograd_guard._policy import files as _policy_files

    return _policy_files


def presets(guards: list[Any]) -> str:
    """The shipped presets, from ``policies/*.toml``: each one's name and first line."""
    files = _policy_files()
    lines = ["| preset | what it is |", "|---|---|"]
    for name in files.preset_names():
        lines.append(f"| `{name}` | {files.preset_summary(name)} |")
    return "\n".join(lines)


def _same_keys(what: str, described: dict[str, str], keys: tuple[str, ...]) -> None:
    if set(described) != set(keys):
        raise ValueError(
            f"docs/hooks.py: the {what} policy keys are {sorted(keys)}; "
            f"described are {sorted(described)}: describe each key there"
        )


def variables(guards: list[Any]) -> str:
    from autograd_guard._common import environment as _environment

    source = Path(_environment.__file__).read_text(encoding="utf-8")
    docs = _attribute_docstrings(ast.parse(source))
    lines = ["| variable | meaning |", "|---|---|"]
    for name in _environment.VARIABLES:
        if name not in docs:
            raise ValueError(f"autograd_guard/_common/environment.py: {name} has no docstring")
        text = " ".join(code(docs[name]).split())
        lines.append(f"| `{name}` | {text} |")
    return "\n".join(lines)


def _attribute_docstrings(tree: ast.Module) -> dict[str, str]:
    """``NAME = "..."`` followed by a string: the string, by the value assigned."""
    found = {}
    for node, after in zip(tree.body, tree.body[1:], strict=False):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[str(node.value.value)] = after.value.value
    return found


def matrix(guards: list[Any]) -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start, end = "<!-- matrix table: nox -s table -->", "<!-- end of matrix table -->"
    if start not in readme or end not in readme:
        raise ValueError("README.md: the matrix table markers are missing")
    return readme.split(start, 1)[1].split(end, 1)[0].strip()


GENERATED = {
    "policy-keys": policy_keys,
    "presets": presets,
    "variables": variables,
    "matrix": matrix,
}


def fill(markdown: str, where: str, guards: list[Any], markers: bool = True) -> str:
    """``markdown`` with every generated section filled afresh; ``markers``: kept (the
    files), or left out (the site)."""

    def section(found: re.Match[str]) -> str:
        name = found.group(1)
        if name.startswith("options:"):
            text = guard_options(guards, name.removeprefix("options:"), where)
        elif name in GENERATED:
            text = GENERATED[name](guards)
        else:
            raise ValueError(f"{where}: unknown generated section {name!r}")
        if not markers:
            return text
        return f"<!-- generated: {name} -->\n{text}\n<!-- end of generated: {name} -->"

    return MARKER.sub(section, markdown)
