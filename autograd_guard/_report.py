"""``autograd-guard report FILE.jsonl``: interventions per guard and call site, across the
processes that shared one JSON-lines log."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from autograd_guard import _events

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse


def report_log(args: argparse.Namespace) -> int:
    """Counts per guard and call site, across the processes that shared the log. A
    process's exit summary holds its exact repeat counts; an event logged after the
    summary, or by a process that died before it, counts once."""
    try:
        lines = Path(args.file).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        print(f"cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    counts, events, processes, bad = _count_log(lines)
    rows = [
        {"guard": k[0], "action": k[1], "callsite": k[2], "count": n} for k, n in counts.items()
    ]
    print(
        f"{_events.describe_counts(rows)} in {_events.plural(processes, 'process')}"
        + (f"; {bad} unreadable lines" if bad else "")
    )
    for guard in sorted({k[0] for k in counts}):
        print(f"{guard}:")
        for key in sorted(k for k in counts if k[0] == guard):
            print(f"  {counts[key]:>7}x  {key[1]:<14} {key[2]}  {events.get(key, '')}")
    return 0


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
