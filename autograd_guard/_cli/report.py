"""``autograd-guard report FILE.jsonl``: interventions and findings per guard and call
site, across the processes that shared one JSON-lines log; ``--json``, ``--guard`` and
``--since``."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from autograd_guard._events import actions as _actions

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a JSON-lines event log")
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    parser.add_argument(
        "--guard", action="append", metavar="NAME", help="only this guard's rows (repeatable)"
    )
    parser.add_argument(
        "--since",
        metavar="TIMESTAMP",
        type=_timestamp,
        help="only events logged at or after this time, ISO 8601 as in the log "
        "(2025-01-31T12:00:00Z; UTC where no zone is given)",
    )


def report_log(args: argparse.Namespace) -> int:
    """Counts per guard and call site, across the processes that shared the log. A
    process's exit summary holds its exact repeat counts; an event logged after the
    summary, or by a process that died before it, counts once. With ``--since``, a
    summary written since then counts with the repeats of its whole process."""
    try:
        lines = Path(args.file).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        print(f"cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    if args.since is not None:
        lines = [line for line in lines if _logged_since(line, args.since)]
    counts, events, processes, bad = _count_log(lines)
    wanted, unknown = _asked_guards(args.guard or [], {guard for guard, _, _ in counts})
    if unknown:
        print(unknown, file=sys.stderr)
        return 2
    ordered = sorted(counts.items(), key=lambda item: _natural(item[0]))
    kept = [(k, n) for k, n in ordered if not wanted or k[0] in wanted]
    rows: list[dict[str, Any]] = [
        {"guard": g, "action": a, "callsite": c, "count": n, "event": events.get((g, a, c), "")}
        for (g, a, c), n in kept
    ]
    headline = _actions.describe_counts(rows)
    if args.json:
        for row in rows:
            row["kind"] = _kind(row["action"])
        report = {"summary": headline, "processes": processes, "unreadable_lines": bad}
        print(json.dumps({**report, "rows": rows}, indent=2))
        return 0
    print(
        f"{headline} in {_actions.plural(processes, 'process')}"
        + (f"; {_actions.plural(bad, 'unreadable line')}" if bad else "")
    )
    cells = [[g, a, str(n), c, events.get((g, a, c), "")] for (g, a, c), n in kept]
    if cells:
        print("\n".join(aligned([["guard", "action", "count", "call site", "event"], *cells])))
    return 0


def _asked_guards(asked: list[str], logged: set[str]) -> tuple[set[str], str]:
    """The guards ``--guard`` names, in any case (``GRAD_HEALTH``), as everywhere else;
    and the message for one that names no guard, installed or in this log (a typo,
    ``grad_helth``), with the closest name ("" when every name is known). A known guard
    with no events here is fine: it just has no rows."""
    from autograd_guard.errors import closest
    from autograd_guard.guards import available

    known = sorted(logged | {guard.name for guard in available()})
    spelled = {name.lower(): name for name in known}
    wanted = {spelled.get(name.lower(), name) for name in asked}
    wrong = [name for name in asked if name.lower() not in spelled]
    if not wrong:
        return wanted, ""
    name = wrong[0]
    guess = closest(name, known)
    hint = f"; did you mean {guess!r}?" if guess else ""
    return wanted, f"--guard: unknown guard {name!r}{hint} (allowed: {', '.join(known)})"


def aligned(table: list[list[str]], right: tuple[int, ...] = (2,)) -> list[str]:
    """Rows of cells as lines in aligned columns; columns in ``right`` align right."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return [
        "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ).rstrip()
        for row in table
    ]


def _natural(key: tuple[str, ...]) -> list[list[tuple[str, int]]]:
    """A sort key that reads numbers as numbers: ``train.py:2`` before ``train.py:10``."""
    return [
        [
            (part, 0) if i % 2 == 0 else ("", int(part))
            for i, part in enumerate(re.split(r"(\d+)", text))
        ]
        for text in key
    ]


def _kind(action: str) -> str:
    if action in _actions.FINDINGS:
        return "finding"
    if action in _actions.ERRORS:
        return "error"
    return "note" if action in _actions.NOT_INTERVENTIONS else "intervention"


def _timestamp(text: str) -> datetime:
    """An ISO 8601 time; UTC where it names no zone (the log's own are UTC)."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time (allowed: 2025-01-31, 2025-01-31T12:00:00Z)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _logged_since(line: str, since: datetime) -> bool:
    """Whether an event was logged at or after ``since``. A line that is not a JSON
    object is kept, to be counted as unreadable; an event without a time is left out."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return True
    if not isinstance(record, dict):
        return True
    try:
        return _timestamp(str(record["timestamp"])) >= since
    except (KeyError, argparse.ArgumentTypeError):
        return False


Key = tuple[str, str, str]


def _count_log(lines: list[str]) -> tuple[Counter[Key], dict[Key, str], int, int]:
    logged: dict[object, Counter[Key]] = {}
    summarised: dict[object, Counter[Key]] = {}
    events: dict[Key, str] = {}
    bad = 0
    for line in lines:
        record = _read_record(line)
        if record is None:
            bad += 1
            continue
        key, process, sites, event = record
        if sites is not None:
            summary = summarised.setdefault(process, Counter())
            summary.update(dict(_parse_site(s) for s in sites))
        else:
            logged.setdefault(process, Counter())[key] += 1
            events.setdefault(key, event)
    counts: Counter[Key] = Counter()
    for process in {*logged, *summarised}:
        own, summary = logged.get(process, Counter()), summarised.get(process, Counter())
        for key in {*own, *summary}:
            counts[key] += max(own[key], summary[key])
    return counts, events, len({*logged, *summarised}), bad


def _read_record(line: str) -> tuple[Key, object, list[str] | None, str] | None:
    """(guard, action, call site), the process, a summary's sites and the event text; None
    for a line that is not one of our events, whatever JSON it holds."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: JSON nested too deeply
        return None
    if not isinstance(record, dict):
        return None
    guard, action, callsite = (record.get(k) for k in ("guard", "action", "callsite"))
    process = record.get("process") or record.get("pid")  # older logs: pid only
    if not (isinstance(guard, str) and isinstance(action, str) and isinstance(callsite, str)):
        return None
    if not isinstance(process, (str, int, type(None))):
        return None
    sites = record.get("sites", []) if action == "summary" else None
    if sites is not None and not (
        isinstance(sites, list) and all(isinstance(s, str) for s in sites)
    ):
        return None
    event = record.get("event", "")
    return (guard, action, callsite), process, sites, event if isinstance(event, str) else ""


def _parse_site(line: str) -> tuple[tuple[str, str, str], int]:
    """Undo the exit summary's "guard/action at file:line xN"."""
    head, _, count = line.rpartition(" x")
    names, _, callsite = head.partition(" at ")
    guard, _, action = names.partition("/")
    return (guard, action, callsite), int(count) if count.isdigit() else 1
