"""What event actions mean: which report no intervention (notes, the guard's own errors),
which report a finding, and the words that count them, for the exit summary and
``autograd-guard report``. ``_events.events`` itself counts actions without knowing them."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Events that report no intervention: setup notes, the guard's own errors, the summary.
NOT_INTERVENTIONS = frozenset(
    {
        "guard_error",
        "load_error",
        "bad_target",
        "late_patch",
        "disabled",
        "over_byte_limit",
        "copy_back",
        "failure_note",
        "compiled_unguarded",
        "scripted_unguarded",
        "not_converted",
        "steps_skipped",
        "steps_repaired",
        "summary",
        "unused_parameter",
    }
)

# The guard's own errors (a guard that failed at a call, one that did not load): counted
# apart from the notes, the other events that report no intervention.
ERRORS = frozenset({"guard_error", "load_error"})

# Events that report a finding: a diagnosis of the user's code; nothing was changed.
FINDINGS = frozenset(
    {
        "cut_gradient",
        "grad_output_modified",
        "lost_gradient",
        "no_gradient",
        "nonfinite_loss",
        "nonfinite_origin",
        "repair_stuck",
        "repair_worse",
        "training_stalled",
        "unattached_rules",
        "wrong_gradient",
        "zero_gradient",
        "zero_gradient_parameter",
    }
)


def describe_counts(rows: list[dict[str, Any]]) -> str:
    """ "3 interventions at 2 call sites; 1 finding; 1 note; 1 guard error" (findings,
    notes and the guard's own errors apart)."""
    done = [r for r in rows if r["action"] not in NOT_INTERVENTIONS | FINDINGS]
    found = sum(r["count"] for r in rows if r["action"] in FINDINGS)
    notes = sum(r["count"] for r in rows if r["action"] in NOT_INTERVENTIONS - ERRORS)
    errors = sum(r["count"] for r in rows if r["action"] in ERRORS)
    text = (
        f"{plural(sum(r['count'] for r in done), 'intervention')} at "
        f"{plural(len({(r['guard'], r['callsite']) for r in done}), 'call site')}"
    )
    text += f"; {plural(found, 'finding')}" if found else ""
    text += f"; {plural(notes, 'note')}" if notes else ""
    return text + (f"; {plural(errors, 'guard error')}" if errors else "")


def plural(count: int, noun: str) -> str:
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {noun}es" if noun.endswith("s") else f"{count} {noun}s"
