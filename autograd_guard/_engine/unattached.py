"""At exit: name the policy's own rules that never attached (their module was never
imported), in the user's program only, not in a process a library started."""

from __future__ import annotations

import os
import sys

from autograd_guard._common import STATE
from autograd_guard._events import events as _events

# What inductor's VecISA probe runs with ``python -c`` (torch 2.1 to at least 2.15).
_INDUCTOR_PROBE = "from ctypes import cdll\ncdll.LoadLibrary("


def _a_library_process() -> bool:
    """A process a library started to run its own code (inductor's compile workers run
    ``python -m torch._inductor...`` or a script inside torch; its CPU probe runs
    ``python -c`` on a snippet that loads a compiled library): not the user's program."""
    command = getattr(sys, "orig_argv", [])
    if "-c" in command[:-1] and _INDUCTOR_PROBE in command[-1]:
        return True
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if spec_name.split(".")[0] == "torch":
        return True
    torch_dir = os.path.dirname(getattr(sys.modules.get("torch"), "__file__", None) or "")
    # The script's path: CPython deletes __main__.__file__ once the script has run, before
    # the exit handlers, so it is read from argv.
    script = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    main_file = os.path.abspath(script) if script else ""
    return bool(torch_dir) and main_file.startswith(torch_dir + os.sep)


def report_unattached_rules() -> None:
    """At exit, once: the policy's own rules whose module this process never imported, so
    that a typo in a module path (``fitlib.trian``) is named, not silently unguarded. A
    finding, not an intervention. Only in a process that imported torch and is not a
    ``multiprocessing`` worker (workers run only part of the program); rules of a shipped
    preset are left out (Unique3D's stages are absent from most programs)."""
    policy = STATE.policy
    multiprocessing = sys.modules.get("multiprocessing")
    if policy is None or "torch" not in sys.modules:
        return
    if multiprocessing is not None and multiprocessing.parent_process() is not None:
        return
    if _a_library_process():
        return
    actions = {g.rule_action for g in STATE.guards if g.rule_action and g.mode != "off"}
    unattached = [
        rule
        for rule in policy.rules
        if rule.action in actions
        and not rule.origin.startswith("preset ")
        and rule.module not in sys.modules
    ]
    if not unattached:
        return
    _events.emit(
        "rules never attached (their module was never imported): "
        + ", ".join(f"{rule.target} ({rule.origin}: {rule.key})" for rule in unattached),
        guard="autograd_guard",
        action="unattached_rules",
        callsite=policy.source,
        rules=[rule.target for rule in unattached],
        remedy="check each rule's module path ('autograd-guard check' resolves it); "
        "a stage this program never runs needs no rule",
    )
