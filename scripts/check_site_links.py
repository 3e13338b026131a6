"""Every link and asset reference in a built docs site leads somewhere: the file exists
(a folder by its ``index.html``) and so does the ``#anchor`` it names. Links out of the
site (``https://``, ``mailto:``) are left alone: CI has no network.

    python -m mkdocs build --strict --site-dir site && python scripts/check_site_links.py site
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

EXTERNAL = ("http:", "https:", "mailto:", "javascript:", "data:", "//")


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("id", "name") and value:
                self.ids.add(value)
            elif name in ("href", "src") and value and not value.startswith(EXTERNAL):
                self.links.append(value)


def _target(page: Path, link: str, root: Path) -> Path:
    path = unquote(urlsplit(link).path)
    base = root if path.startswith("/") else page.parent  # 404.html links from the root
    target = (base / path.lstrip("/")).resolve() if path else page
    if target.is_dir():
        target = target / "index.html"
    return target if target.is_relative_to(root.resolve()) else root / "outside-the-site"


def broken_links(root: Path) -> tuple[list[str], int]:
    """``page: link (why)`` for each link that leads nowhere; and how many were read."""
    pages: dict[Path, _Page] = {}
    for path in sorted(root.rglob("*.html")):
        parsed = _Page()
        parsed.feed(path.read_text(encoding="utf-8"))
        pages[path.resolve()] = parsed
    broken: list[str] = []
    read = 0
    for path, parsed in pages.items():
        read += len(parsed.links)
        for link in parsed.links:
            target = _target(path, link, root)
            anchor = unquote(urlsplit(link).fragment)
            where = f"{path.relative_to(root.resolve())}: {link}"
            if not target.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and target in pages and anchor not in pages[target].ids:
                broken.append(f"{where} (no #{anchor} there)")
    return broken, read


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else "site")
    if not (root / "index.html").is_file():
        print(f"{root}: no built site here (index.html)", file=sys.stderr)
        return 2
    broken, read = broken_links(root)
    for line in broken:
        print(line)
    print(f"{root}: {len(broken)} of {read} links broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
