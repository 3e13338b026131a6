"""Start-up with the variable set: watch only the modules that a cached start plan names,
and load the engine, the policy and the guards at the first import of one of them.

A plan is made by a start that did the whole install (no plan yet, or a stale one): the
modules the guards then watched, the policy files read (with their sizes and checksums) and
the folders on ``sys.path`` (with theirs, for third-party guards). It is trusted only
while the same policy file is discovered and nothing it names has changed, so a process
that never imports a target pays for a few ``stat`` calls and one cache read.
"""

from __future__ import annotations

import os

from autograd_guard._common import environment as _environment
from autograd_guard._common import importer as _importer
from autograd_guard._common.cache import DiskCache, path_fingerprint
from autograd_guard._common.state import STATE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any


def start() -> None:
    """The auto-load: from the plan if it holds, else the whole install (and a new plan)."""
    key = _plan_key()
    modules = _modules_if_valid(DiskCache.shared().plan(key))
    if modules is None:
        install_now(key)
        return
    for name in modules:
        _importer.when_imported(name, _install_then_run_hooks)


def install_now(key: str | None = None) -> None:
    from autograd_guard._engine import engine as _engine

    _engine.install_from_environment()
    if key is not None and STATE.policy is not None and STATE.error is None:
        _save_plan(key)


def _install_then_run_hooks(module: ModuleType) -> None:
    """The first watched module is being imported: install, then run the hooks that the
    install registered for it (it is still initialising, so they did not fire)."""
    with STATE.import_lock:
        STATE.hooks.clear()  # the plan's own hooks
    install_now()
    if not _importer.initialising(module):
        return  # imported before the start: the install's own hooks have run already
    with STATE.import_lock:
        hooks = list(STATE.hooks.get(module.__name__, ()))
    for hook in hooks:
        hook(module)


def _plan_key() -> str:
    from autograd_guard._common import VERSION

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    settings = [os.environ.get(name, "") for name in _environment.VARIABLES]
    guards = os.path.join(package, "guards")
    try:  # a guard module added or removed (an editable install) changes the folder
        layout = str(os.stat(guards).st_mtime_ns)
    except OSError:
        layout = ""
    return "\0".join([package, VERSION, layout, os.getcwd(), *settings])


def _stamp(path: str) -> list[Any] | None:
    """The file's size and a checksum of its bytes: a policy replaced by one of the same
    size and mtime (``cp -p``, ``tar x``, images with fixed timestamps) is a new policy."""
    from autograd_guard._policy.files import MAX_POLICY_BYTES

    try:
        with open(path, "rb") as f:
            data = f.read(MAX_POLICY_BYTES + 1)
    except OSError:
        return None
    # The bytes as one number modulo a prime: stable across processes (hash() is salted)
    # and without importing zlib or hashlib at start-up.
    return [path, len(data), int.from_bytes(data, "little") % _PRIME]


_PRIME = 2**64 - 59  # the largest 64-bit prime (a Mersenne prime would weigh bytes 61 apart alike)


def _save_plan(key: str) -> None:
    policy = STATE.policy
    files = [_stamp(path) for path in policy.files]
    if None in files or not policy.files:
        return  # a dict policy, or a file that went away: no plan
    plan = {"files": files, "path": path_fingerprint(), "modules": _importer.watched()}
    DiskCache.shared().put_plan(key, plan)


def _modules_if_valid(plan: Any) -> list[str] | None:
    """The plan's modules, if its shape is right and nothing it depends on changed."""
    if not isinstance(plan, dict):
        return None
    files, modules = plan.get("files"), plan.get("modules")
    if not (isinstance(files, list) and files and isinstance(modules, list)):
        return None
    if not all(isinstance(m, str) for m in modules) or plan.get("path") != path_fingerprint():
        return None
    if any(not isinstance(f, list) or not f or _stamp(f[0]) != f for f in files):
        return None
    from autograd_guard._policy.files import discover

    try:  # the same file must still be the one discovered
        if discover(None, os.getcwd()).path != files[0][0]:
            return None
    except Exception:
        return None
    return modules
