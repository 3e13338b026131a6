"""MkDocs hook: the pages that are generated from the code, so that they cannot drift.

- ``guards/<name>.md``, one per built-in guard (``autograd_guard.guards.builtin()``), written
  as its bug report from the module docstring (Symptom, Affected, Upstream, Remedy) and the
  class attributes (distribution, affected versions, targets, options). A new guard module
  gets its page, and a guard that fails to import fails the build.
- ``guards/index.md``: the table of every guard.
- ``changelog.md``: ``CHANGELOG.md`` itself.
- The generated sections of hand-written pages (``docs/generated_sections.py``). The
  site fills them afresh; ``python docs/hooks.py`` writes them into the files, so that the
  pages read whole on GitHub too (tests/test_docs.py fails where a file's copy is stale).
- Links that work in the files (``../autograd_guard/guards/``, a guard's module,
  ``../CHANGELOG.md``) lead to the generated pages on the site.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # generated_sections.py, beside
import generated_sections
from generated_sections import code, options_table

ROOT = Path(__file__).resolve().parent.parent
# A link to the guards' folder or a guard's module, and to the changelog, as the files have it.
FILE_LINK = re.compile(
    r"\]\(\.\./(autograd_guard/guards/(?:(\w+)(?:\.py|/[\w./]*)?)?|CHANGELOG\.md)\)"
)
LABEL = re.compile(r"^([A-Z][a-z]+(?: [a-z]+)?): (.*)$")


def _guards() -> list[Any]:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from autograd_guard.guards import builtin

    return builtin()  # raises where a guard module fails to import: the build fails


def _report_sections(guard: Any) -> tuple[str, list[tuple[str, str]]]:
    """The module docstring: its title line, then ``(label, text)`` sections."""
    doc = code(sys.modules[guard.__module__].__doc__ or "").strip()
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
    return f"<{upstream}>" if upstream.startswith("https://") else code(upstream)


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


def guard_page(guard: Any) -> str:
    title, sections = _report_sections(guard)
    lines = [f"# `{guard.name}`: {title}", "", *_facts(guard), ""]
    for label, text in sections:
        lines += [f"## {label}" if label else "", "", text, ""]
    if guard.options:
        lines += ["## Options", "", f"In the policy's `[guards.{guard.name}]` table:", ""]
        lines += [*options_table(guard.options), ""]
    if guard.rule_options:
        lines += [f'## Options of `action = "{guard.rule_action}"` rules', ""]
        lines += [*options_table(guard.rule_options), ""]
    lines.append(f"*Generated from `{guard.__module__}`.*")
    return "\n".join(lines) + "\n"


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


def fill(markdown: str, where: str, markers: bool = True) -> str:
    """``markdown`` with every generated section filled afresh (``generated_sections``)."""
    return generated_sections.fill(markdown, where, _guards(), markers)


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
