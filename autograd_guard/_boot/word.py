"""The run's last line on a terminal.

Symptom: a correct guarded run printed nothing, exactly as a run in a venv without the
package, under ``python -S`` or ``autograd-guard run -- python -S`` did: "guarded and
fine" looked the same as "not guarded at all".

Affected: every version before this module (0.1.0).

Remedy: where stderr is a terminal, a guarded PyTorch program (torch imported, the guard
installed) with nothing to report ends with one short line: the guard was on, its mode
and policy, and how many optimizer steps ``grad_health`` watched. Where something was
reported, the exit summary is that last line already. Where stderr is no terminal (a
file, a pipe, CI), nothing is added: the output stays the program's own. Only the main
process says it: not a ``multiprocessing`` child (a DataLoader worker), not a rank other
than 0.
"""

from __future__ import annotations

import os
import sys

from autograd_guard._common import STATE
from autograd_guard._common import environment as _environment
from autograd_guard._events import events as _events
from autograd_guard._events.actions import plural


def register() -> None:
    """Say the line at exit, after the summary, where it applies then."""
    pid = os.getpid()

    def say() -> None:
        text = line() if os.getpid() == pid else None
        if text is not None:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    _events.after_summary(say)


def line() -> str | None:
    """The line, or None where it does not apply."""
    policy = STATE.policy
    if policy is None or STATE.muted or "torch" not in sys.modules or _events.summary():
        return None
    if not _is_terminal() or not _main_process():
        return None
    steps = [
        g.steps_watched() for g in STATE.guards if hasattr(g, "steps_watched") and g.mode != "off"
    ]
    watched = plural(sum(steps), "optimizer step") + " watched" if steps else "grad_health off"
    mode = policy.env_mode or policy.mode
    return f"autograd-guard: on (mode {mode}, policy {policy.source}); {watched}; nothing to report"


def _is_terminal() -> bool:
    try:
        return bool(sys.stderr.isatty())
    except Exception:  # closed or replaced by an object without isatty
        return False


def _main_process() -> bool:
    multiprocessing = sys.modules.get("multiprocessing")
    parent = getattr(multiprocessing, "parent_process", None)
    if parent is not None and parent() is not None:
        return False
    return _environment.rank() in (None, 0)
