"""The guards: built-in ones (one module each, each reading as the bug report it answers),
guards registered in code, and third-party guards from the ``autograd_guard.guards``
entry-point group (``name = "package.module:GuardClass"``)."""

from __future__ import annotations

import os
import sys

from autograd_guard._common import STATE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from autograd_guard._runtime.guard import Guard

# The built-in guards, by module name. A static list on purpose, not the entry-point group
# that third-party guards use: reading entry points costs importlib.metadata and a scan of
# every distribution at start-up, and the built-ins ship with this package anyway. Each is
# checked as a third-party guard is (a Guard subclass whose name is its module's).
BUILTIN = (
    "grad_mode",
    "snapshot_inputs",
    "pytorch3d_taubin",
    "pytorch3d_bin_overflow",
    "pytorch3d_hard_silhouette",
    "pytorch3d_point_radius",
    "pytorch3d_euler_gimbal",
    "pytorch3d_face_normals",
    "warp_torch_args",
    "warp_tape",
    "warp_copy_adjoint",
    "gsplat_means2d",
    "ipex_xpu",
    "grad_health",
    "grad_audit",
)
ENTRY_POINT_GROUP = "autograd_guard.guards"


def builtin() -> list[type[Guard]]:
    return [_load(name, f"autograd_guard.guards.{name}:GUARD") for name in BUILTIN]


def available(environ: Mapping[str, str] | None = None) -> list[type[Guard]]:
    """Every guard this process can use: built-in, registered, then third-party."""
    guards = builtin() + list(STATE.registered)
    return guards + third_party({g.name for g in guards}, environ)


def register(guard: type[Guard]) -> None:
    """Add a guard class (takes effect at the next ``install``); ``TypeError`` where it
    breaks the guard contract."""
    from autograd_guard._runtime import contract as _guard_contract

    _guard_contract.check(guard)
    if guard not in STATE.registered:
        STATE.registered.append(guard)


def unregister(guard: type[Guard]) -> None:
    if guard in STATE.registered:
        STATE.registered.remove(guard)


def third_party(taken: set[str], environ: Mapping[str, str] | None = None) -> list[type[Guard]]:
    """Guards that installed distributions declare as entry points.

    One that fails to load is reported once and stands in the list as a guard that
    does nothing, so that the policy can still name it; the others are unaffected.
    Guards switched off by ``AUTOGRAD_GUARD_DISABLE`` are not even imported.
    """
    from autograd_guard._common.environment import disabled as disabled_in

    disabled = disabled_in(environ)
    guards = []
    for name, value, distribution in entry_points():
        if name in taken:
            continue
        if name in disabled or "*" in disabled:
            guards.append(_unavailable(name, distribution, "disabled by AUTOGRAD_GUARD_DISABLE"))
            continue
        try:
            guard = _load(name, value)
        except Exception as exc:  # fail open: one broken guard must not stop the others
            guards.append(_unavailable(name, distribution, f"failed to load: {exc!r}"))
            _report_broken(name, value, distribution, exc)
            continue
        guard.provided_by = distribution
        guards.append(guard)
        taken.add(name)
    return guards


def _load(name: str, value: str) -> type[Guard]:
    from autograd_guard._runtime import contract as _guard_contract
    from autograd_guard._runtime.guard import Guard

    module_name, _, attribute = value.partition(":")
    __import__(module_name)
    loaded: object = sys.modules[module_name]
    for part in attribute.split(".") if attribute else ["GUARD"]:
        loaded = getattr(loaded, part)
    if not (isinstance(loaded, type) and issubclass(loaded, Guard)):
        raise TypeError(f"{value} is not an autograd_guard Guard subclass")
    if loaded.name != name:
        raise ValueError(f"entry point {name!r} loads a guard named {loaded.name!r}")
    _guard_contract.check(loaded)
    return loaded


def _unavailable(name: str, distribution: str, why: str) -> type[Guard]:
    from autograd_guard._runtime.guard import Guard

    return type(
        f"Unavailable_{name}",
        (Guard,),
        {
            "name": name,
            "provided_by": distribution,
            "unavailable": why,
            "symptom": f"third-party guard {name} is unavailable: {why}",
        },
    )


def _report_broken(name: str, value: str, distribution: str, exc: Exception) -> None:
    from autograd_guard._events import events as _events

    _events.emit(
        f"third-party guard {name!r} from {distribution} failed to load; skipped",
        guard=name,
        action="load_error",
        callsite=value,
        level="error",
        distribution=distribution,
        error=repr(exc)[:500],
    )


def entry_points() -> list[tuple[str, str, str]]:
    """(name, value, distribution) of every guard entry point, cached between runs.

    Read straight from each ``*.dist-info/entry_points.txt`` on ``sys.path``:
    ``importlib.metadata`` would cost its import and a scan of every distribution's
    metadata. Cached against the mtimes of the folders on ``sys.path`` (installing or
    removing a distribution changes its folder's mtime).
    """
    from autograd_guard._common.cache import DiskCache, path_fingerprint

    stamps = path_fingerprint()
    key = "\n".join(f"{path}\0{mtime}" for path, mtime in stamps).encode("utf-8", "surrogateescape")
    cache = DiskCache.shared()
    cached = cache.get("<entry points>", key)
    rows = cached.get("entry_points") if cached else None
    if isinstance(rows, list) and all(_is_row(row) for row in rows):
        return [(row[0], row[1], row[2]) for row in rows]
    found = _scan_entry_points()
    cache.put("<entry points>", key, {"entry_points": [list(row) for row in found]})
    return found


def _is_row(row: object) -> bool:
    return isinstance(row, list) and len(row) == 3 and all(isinstance(v, str) for v in row)


def _scan_entry_points() -> list[tuple[str, str, str]]:
    found: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for folder in sys.path:
        try:
            names = sorted(os.listdir(folder or "."))
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            distribution = name.rpartition(".")[0].partition("-")[0].replace("_", "-")
            if distribution.lower() in seen:
                continue  # the first on sys.path wins, as for imports
            seen.add(distribution.lower())
            path = os.path.join(folder or ".", name, "entry_points.txt")
            found += [(n, v, distribution) for n, v in _guard_entries(path)]
    return found


def _guard_entries(path: str) -> list[tuple[str, str]]:
    """``name = value`` lines of the ``[autograd_guard.guards]`` section of an
    entry_points.txt (an INI file)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    entries, inside = [], False
    for line in lines:
        text = line.strip()
        if text.startswith("["):
            inside = text == f"[{ENTRY_POINT_GROUP}]"
        elif inside and "=" in text and not text.startswith(("#", ";")):
            name, _, value = text.partition("=")
            entries.append((name.strip(), value.strip()))
    return entries
