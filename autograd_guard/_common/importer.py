"""Post-import hooks: call a function right after a named module has executed.

This is wrapt's ``register_post_import_hook`` reduced to what the guard needs, written
here because importing wrapt at start-up costs ~65 ms (its ``caching`` module imports
asyncio); wrapt itself is only imported once a target module is actually imported.
Hooks fire at once for modules that are already imported, and again after a reload.
A start with a plan imports this module (see ``_boot``): no ``__future__`` import (a module
of its own), so annotations that name a type only a checker knows are strings.
"""

import sys

from autograd_guard._common import STATE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

    Hook = Callable[[ModuleType], None]


def when_imported(name: str, hook: "Hook") -> None:
    """Call ``hook(module)`` once ``name`` is imported (now, if it already is).

    The hook must not raise; callers wrap their hooks to fail open.
    """
    with STATE.import_lock:
        STATE.hooks.setdefault(name, []).append(hook)
        _ensure_finder()
    module = sys.modules.get(name)
    if module is not None and not initialising(module):
        hook(module)


def clear() -> None:
    """Forget every hook and take the finders off ``sys.meta_path`` (the bootstrap's
    ``STATE.watch`` too, see ``_boot``)."""
    with STATE.import_lock:
        STATE.hooks.clear()
        if STATE.watch is not None and STATE.watch in sys.meta_path:
            sys.meta_path.remove(STATE.watch)
        STATE.watch = None
        if STATE.finder is not None and STATE.finder in sys.meta_path:
            sys.meta_path.remove(STATE.finder)
        STATE.finder = None


def watched() -> list[str]:
    """The modules hooked, and those the bootstrap's plan watches (``STATE.watch``)."""
    with STATE.import_lock:
        return sorted({*STATE.hooks, *getattr(STATE.watch, "modules", ())})


def initialising(module: "ModuleType") -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _ensure_finder() -> None:
    if STATE.finder is None:
        STATE.finder = _PostImportFinder()
        sys.meta_path.insert(0, STATE.finder)


def _fire(module: "ModuleType") -> None:
    hooks = list(STATE.hooks.get(module.__name__, ()))  # one copy under the GIL: no lock
    for hook in hooks:
        hook(module)


class _PostImportFinder:
    """A meta-path finder that lends the real loader a post-exec step for watched names."""

    def find_spec(
        self,
        fullname: str,
        path: "Sequence[str] | None" = None,
        target: "ModuleType | None" = None,
    ) -> "ModuleSpec | None":
        if fullname not in STATE.hooks:
            return None
        # Ask the finders after this one, so that this finder never recurses into itself.
        meta_path = sys.meta_path
        start = meta_path.index(self) + 1 if self in meta_path else 0
        for finder in meta_path[start:]:
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _PostImportLoader(spec.loader)
            return spec  # type: ignore[no-any-return]
        return None

    def invalidate_caches(self) -> None:
        pass


class _PostImportLoader:
    """Runs the real loader, then the hooks; hands the module back its real loader."""

    def __init__(self, loader: object) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> object:
        return getattr(self.loader, name)

    def create_module(self, spec: "ModuleSpec") -> "ModuleType | None":
        return self.loader.create_module(spec)  # type: ignore[attr-defined, no-any-return]

    def exec_module(self, module: "ModuleType") -> None:
        # Reset the loader first so that pkgutil/importlib.resources see the real one,
        # even while the module executes.
        module.__loader__ = self.loader  # type: ignore[assignment]
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self.loader
        self.loader.exec_module(module)  # type: ignore[attr-defined]
        _fire(module)
