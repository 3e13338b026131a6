"""Start plans: what a start with the variable set needs to watch, made by a start that did
the whole install (no plan yet, or a stale one), so that the next ones load the engine, the
policy and the guards only at the first import of a module the guards watch.

A plan holds the modules the guards then watched, the policy files read and the files
policy discovery looked at (each with its size and a checksum, or None where there was
none) and the folders on ``sys.path`` (with their mtimes, for third-party guards). The
bootstrap (``_boot``) trusts it only while nothing it names has changed, so a process that
never imports a target pays for a few ``stat`` calls and one cache read.
"""

from __future__ import annotations

import os
import sys

from autograd_guard._common import STATE, importer, path_fingerprint, stamp
from autograd_guard._common.cache import DiskCache

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType


def install_now(key: str | None = None) -> None:
    """The whole install, from the environment; then a new plan under ``key``, if any."""
    from autograd_guard._engine import engine as _engine

    _engine.install_from_environment()
    if STATE.policy is not None:
        from autograd_guard._boot import word

        word.register()
    if key is not None and STATE.policy is not None and STATE.error is None:
        _save_plan(key)


def hook_the_plan() -> None:
    """Replace the plan's finder by a post-import hook on each of its modules."""
    STATE.follow_forks()  # before the first lock: see State.follow_forks
    with STATE.import_lock:
        watch, STATE.watch = STATE.watch, None
        if watch is None:
            return  # another thread did it, or an install replaced the plan
        if watch in sys.meta_path:
            sys.meta_path.remove(watch)
        for name in sorted(watch.modules):
            importer.when_imported(name, _install_then_run_hooks)


def _install_then_run_hooks(module: ModuleType) -> None:
    """The first watched module is being imported: install, then run the hooks that the
    install registered for it (it is still initialising, so they did not fire)."""
    with STATE.import_lock:
        STATE.hooks.clear()  # the plan's own hooks
    install_now()
    if not importer.initialising(module):
        return  # imported before the start: the install's own hooks have run already
    with STATE.import_lock:
        hooks = list(STATE.hooks.get(module.__name__, ()))
    for hook in hooks:
        hook(module)


def _save_plan(key: str) -> None:
    from autograd_guard._policy.files import discover, program_folder

    policy = STATE.policy
    files = [stamp(path) for path in policy.files]
    if None in files or not policy.files:
        return  # a dict policy, or a file that went away: no plan
    consulted: list[str] = []
    try:
        if discover(None, os.getcwd(), consulted, program_folder()).path != policy.files[0]:
            return  # the policy was not the one discovered
    except Exception:
        return
    plan = {
        "files": [[path, stamp(path)] for path in policy.files],
        "consulted": [[path, stamp(path)] for path in consulted],
        "path": path_fingerprint(),
        "modules": importer.watched(),
    }
    DiskCache.shared().put_plan(key, plan)
