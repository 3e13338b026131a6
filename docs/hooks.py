"""MkDocs hook: the pages that are generated from the code, so that they cannot drift.

- ``guards/<name>.md``, one per built-in guard (``autograd_guard.guards.builtin()``), written
  as its bug report from the module docstring (Symptom, Affected, Upstream, Remedy) and the
  class attributes (distribution, affected versions, targets, options). A new guard module
  gets its page, and a guard that fails to import fails the build.
- ``guards/index.md``: the table of every guard.
- ``changelog.md``: ``CHANGELOG.md`` itself.
- ``<!-- generated: NAME -->`` ... ``<!-- end of generated: NAME -->`` sections of
  hand-written pages: the policy keys (from ``autograd_guard._policy.schema``), the shipped
  presets (``policies/*.toml``, each one's first line), the environment variables
  (``autograd_guard._common.environment.VARIABLES`` and their docstrings), a guard's options
  and the version-matrix table (the one ``nox -s table`` writes into the README). The
  site fills them afresh; ``python docs/hooks.py`` writes them into the files, so that the
  pages read whole on GitHub too (tests/test_docs.py fails where a file's copy is stale).
- Links that work in the files (``../autograd_guard/guards/``, a guard's module,
  ``../CHANGELOG.md``) lead to the generated pages on the site.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(
    r"<!-- generated: ([\w:-]+) -->\n.*?<!-- end of generated: \1 -->", flags=re.DOTALL
)
# A link to the guards' folder or a guard's module, and to the changelog, as the files have it.
FILE_LINK = re.compile(
    r"\]\(\.\./(autograd_guard/guards/(?:(\w+)(?:\.py|/[\w./]*)?)?|CHANGELOG\.md)\)"
)
LABEL = re.compile(r"^([A-Z][a-z]+(?: [a-z]+)?): (.*)$")

# The top-level policy keys and a guard table's own keys, described once here; the build
# fails where the schema gains or loses a key that this list does not.
TOP_LEVEL = {
    "extends": "a preset name ({presets}) or a policy file path, relative to this file; "
    "its settings come first and this file's are merged over them",
    "mode": "`off`, `observe` (log only), `fix` (remedy and log) or `strict` (raise)",
    "log": "`stderr` (one readable line per event), `logging` (the `autograd_guard` "
    "logger) or a file path (JSON lines)",
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


def _code(text: str) -> str:
    """reStructuredText literals (````x````) as Markdown ones."""
    return text.replace("``", "`")


def _guards() -> list[Any]:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from autograd_guard.guards import builtin

    return builtin()  # raises where a guard module fails to import: the build fails


def _report_sections(guard: Any) -> tuple[str, list[tuple[str, str]]]:
    """The module docstring: its title line, then ``(label, text)`` sections."""
    doc = _code(sys.modules[guard.__module__].__doc__ or "").strip()
    title, _, body = doc.partition("\n")
    sections: list[tuple[str, str]] = []
    for line in body.strip().splitlines():
        found = LABEL.match(line)
        if found:
            sections.append((found.group(1), found.group(2)))
        elif sections:
            label, text = sections[-1]
            sections[-1] = (label, f"{text} {line.strip()}".strip())
        else:
            sections.append(("", line.strip()))
    return title.removeprefix(f"Guard `{guard.name}`:").strip(), sections


def _link(upstream: str) -> str:
    return f"<{upstream}>" if upstream.startswith("https://") else _code(upstream)


def _facts(guard: Any) -> list[str]:
    distribution = guard.distribution
    if isinstance(distribution, tuple):
        distribution = " or ".join(f"`{d}`" for d in distribution)
    elif distribution:
        distribution = f"`{distribution}`"
    rows = [
        ("library", distribution or "none: it guards your own code or torch itself"),
        ("affected versions", f"`{guard.affected}`" if guard.affected else "every version"),
        ("symptom", guard.symptom),
        ("upstream", _link(guard.upstream) if guard.upstream else "none known"),
        ("remedy", guard.remedy),
    ]
    targets = [f"`{t.module}:{t.qualname}`" for t in guard.targets]
    if targets:
        rows.append(("wraps", ", ".join(targets)))
    if guard.modules:
        rows.append(("hooks in at the import of", ", ".join(f"`{m}`" for m in guard.modules)))
    if guard.rule_action:
        rows.append(("policy rules", f'`[[rules]]` with `action = "{guard.rule_action}"`'))
    return ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]


def _options_table(options: dict[str, Any]) -> list[str]:
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


def guard_page(guard: Any) -> str:
    title, sections = _report_sections(guard)
    lines = [f"# `{guard.name}`: {title}", "", *_facts(guard), ""]
    for label, text in sections:
        lines += [f"## {label}" if label else "", "", text, ""]
    if guard.options:
        lines += ["## Options", "", f"In the policy's `[guards.{guard.name}]` table:", ""]
        lines += [*_options_table(guard.options), ""]
    if guard.rule_options:
        lines += [f'## Options of `action = "{guard.rule_action}"` rules', ""]
        lines += [*_options_table(guard.rule_options), ""]
    lines.append(f"*Generated from `{guard.__module__}`.*")
    return "\n".join(lines) + "\n"


def guard_options(name: str, where: str) -> str:
    by_name = {guard.name: guard for guard in _guards()}
    if name not in by_name:
        raise ValueError(f"{where}: no guard {name!r} (guards: {', '.join(by_name)})")
    return "\n".join(_options_table(by_name[name].options))


def guards_index(guards: list[Any]) -> str:
    lines = [
        "# Guards",
        "",
        "Each guard is one module in `autograd_guard/guards/` that reads as the bug report it",
        "answers; each page below is generated from that module. `autograd-guard doctor` says",
        "which of them apply to the versions installed here.",
        "",
        "| guard | library | affected | symptom |",
        "|---|---|---|---|",
    ]
    for guard in guards:
        library = guard.distribution
        library = " / ".join(library) if isinstance(library, tuple) else library or "-"
        affected = guard.affected or "every version"
        lines.append(
            f"| [`{guard.name}`]({guard.name}.md) | {library} | {affected} | {guard.symptom} |"
        )
    return "\n".join(lines) + "\n"


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
            lines += [f"`[guards.{guard.name}]`", "", *_options_table(guard.options), ""]
    for guard in guards:
        if guard.rule_action:
            lines.append(f'`[[rules]]` with `action = "{guard.rule_action}"` ({guard.name}):')
            lines.append("")
            options = guard.rule_options
            keys = [*schema.RULE_KEYS, *options]
            lines += [", ".join(f"`{k}`" for k in keys) + ".", ""]
            if options:
                lines += [*_options_table(options), ""]
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
        text = " ".join(_code(docs[name]).split())
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


def on_config(config: Any) -> Any:
    """Lists every guard page under the nav's "Guards" section, but for a guard that has
    a guide of its own in the nav (grad_health): listed once, there, its generated page
    linked from the guide and the guards' table (mkdocs.yml's not_in_nav)."""
    titles = {title for entry in config["nav"] or [] if isinstance(entry, dict) for title in entry}
    names = [guard.name for guard in _guards() if guard.name not in titles]
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and "Guards" in entry:
            pages = [{name: f"guards/{name}.md"} for name in names]
            entry["Guards"] = ["guards/index.md", *pages]
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    guards = _guards()
    pages = {"guards/index.md": guards_index(guards)}
    pages |= {f"guards/{g.name}.md": guard_page(g) for g in guards}
    pages["changelog.md"] = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files


def fill(markdown: str, where: str, markers: bool = True) -> str:
    """``markdown`` with every generated section filled afresh; ``markers``: kept (the
    files), or left out (the site)."""

    def section(found: re.Match[str]) -> str:
        name = found.group(1)
        if name.startswith("options:"):
            text = guard_options(name.removeprefix("options:"), where)
        elif name in GENERATED:
            text = GENERATED[name](_guards())
        else:
            raise ValueError(f"{where}: unknown generated section {name!r}")
        if not markers:
            return text
        return f"<!-- generated: {name} -->\n{text}\n<!-- end of generated: {name} -->"

    return MARKER.sub(section, markdown)


def site_links(markdown: str, where: str) -> str:
    """The files' links to the guards' modules and the changelog, as links to the site's
    generated pages."""
    names = {guard.name for guard in _guards()}

    def page(found: re.Match[str]) -> str:
        target, guard = found.group(1), found.group(2)
        if target == "CHANGELOG.md":
            return "](changelog.md)"
        if guard is None:
            return "](guards/index.md)"
        if guard not in names:
            raise ValueError(f"{where}: {target} is no guard's module (guards: {sorted(names)})")
        return f"](guards/{guard}.md)"

    return FILE_LINK.sub(page, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    where = page.file.src_uri
    return site_links(fill(markdown, where, markers=False), where)


if __name__ == "__main__":
    # Writes the generated sections into docs/*.md; --check: only says which are stale.
    stale = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        text = path.read_text(encoding="utf-8")
        fresh = fill(text, path.name)
        if fresh != text:
            stale.append(path.name)
            if "--check" not in sys.argv:
                path.write_text(fresh, encoding="utf-8")
    print("stale:" if "--check" in sys.argv else "written:", " ".join(stale) or "none")
    sys.exit(1 if stale and "--check" in sys.argv else 0)
