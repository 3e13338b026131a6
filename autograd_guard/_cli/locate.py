"""Find a module by its dotted name without importing it or any package above it.

``importlib.util.find_spec("a.b")`` imports ``a`` (its ``__init__`` runs); a policy is
data and ``check`` must never run the code it names. So only the top-level name goes
through ``sys.meta_path`` (which imports nothing for a top-level name); each further part
is looked up with ``PathFinder`` in its parent's ``submodule_search_locations``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys

from autograd_guard.errors import closest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec


def why_not_found(dotted: str, search: Sequence[str]) -> str:
    """ "" when module ``dotted`` can be found, else why not, in words, with the closest
    name for a typo. ``search``: the folders where the program will look for top-level
    modules (besides ``sys.meta_path``)."""
    parts = dotted.split(".")
    spec = _find_top(parts[0], search)
    if spec is None:
        return f"no module {parts[0]!r} can be found here{_top_level_guess(parts[0], search)}"
    for depth in range(1, len(parts)):
        parent, name = ".".join(parts[:depth]), ".".join(parts[: depth + 1])
        locations = _search_locations(parent, spec)
        if locations is None:
            return f"{parent!r} is a module, not a package: it has no submodule {parts[depth]!r}"
        found = importlib.machinery.PathFinder.find_spec(name, locations)
        if found is None:
            return _missing_submodule(parent, parts[depth], locations)
        spec = found
    return ""


def installed(dotted: str, search: Sequence[str]) -> bool:
    """Whether the top-level package of ``dotted`` can be found (a missing module below it
    is then a typo, not a package that this environment lacks)."""
    return _find_top(dotted.partition(".")[0], search) is not None


def _find_top(name: str, search: Sequence[str]) -> ModuleSpec | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # ValueError: in sys.modules without a __spec__
        spec = None
    return spec or importlib.machinery.PathFinder.find_spec(name, list(search))


def _top_level_guess(name: str, search: Sequence[str]) -> str:
    import pkgutil  # lists files; imports nothing

    guess = closest(name, [info.name for info in pkgutil.iter_modules(list(search))])
    return f"; did you mean {guess!r}?" if guess else ""


def _search_locations(parent: str, spec: ModuleSpec) -> list[str] | None:
    """Where ``parent``'s submodules live: its ``__path__`` once imported (a package may
    extend it), else what its spec says."""
    module = sys.modules.get(parent)
    path = getattr(module, "__path__", None) if module is not None else None
    locations = path if path is not None else spec.submodule_search_locations
    return None if locations is None else list(locations)


def _missing_submodule(parent: str, name: str, locations: list[str]) -> str:
    import pkgutil  # lists files; imports nothing of the package

    siblings = [info.name for info in pkgutil.iter_modules(locations)]
    guess = closest(name, siblings)
    hint = f"; did you mean '{parent}.{guess}'?" if guess else ""
    where = ", ".join(locations)
    return f"package {parent!r} ({where}) has no module {name!r}{hint}"
