"""Compare a guarded run with its unguarded twin: exit status, output, the exception and its
chain, the files written (tensors in ``.pt`` files bit for bit, dtype and NaN positions
included), every warning issued and the events, which must be exactly those the case
expects.

Warnings are compared as issued, each time (``-W always``), as a multiset (a worker thread's
may come in any order): the same ones, or, where the guarded run ends with the exception
the case expects, none that the reference did not issue. Each difference says whether the
default filters would show it (once per location; DeprecationWarning and its kin hidden),
or only ``-W always``, ``-W error`` and pytest's summary would."""

from __future__ import annotations

import io
import re
from collections import Counter
from typing import Any

from twin_cases import Expectation
from twin_runner import Outcome, Warned

CALLSITE = re.compile(r"^(?P<file>.+\.py):(?P<line>\d+)$")


def differences(reference: Outcome, guarded: Outcome, expected: Expectation) -> list[str]:
    """What the guarded run did that its reference did not, in words (empty: the same)."""
    where = f"[{guarded.variant} vs {reference.variant}]"
    problems = [f"{where} {p}" for p in _event_problems(guarded, expected)]
    problems += [f"{where} {p}" for p in _stderr_problems(guarded, expected)]
    if expected.raises is not None:
        raised = (guarded.exception or {}).get("type")
        if raised != expected.raises:
            problems.append(f"{where} ended with {raised}, expected {expected.raises}")
        added = Counter(guarded.warnings) - Counter(reference.warnings)
        return problems + [f"{where} {p}" for p in _warning_lines("issued", added, guarded)]
    problems += [f"{where} {p}" for p in outcome_differences(reference, guarded)]
    return problems


def outcome_differences(first: Outcome, second: Outcome) -> list[str]:
    """How two runs' observable results differ (events and stderr aside)."""
    problems = warning_differences(first, second)
    if first.returncode != second.returncode:
        problems.append(f"exit status {second.returncode}, expected {first.returncode}")
    if first.exception != second.exception:
        problems.append(f"exception {second.exception}, expected {first.exception}")
    if first.stdout != second.stdout:
        problems.append(f"stdout:\n{second.stdout}\nexpected:\n{first.stdout}")
    for name in sorted(set(first.files) | set(second.files)):
        mine, theirs = second.files.get(name), first.files.get(name)
        if mine is None or theirs is None:
            problems.append(f"file {name} written by {'one' if mine is None else 'the guarded'}")
        elif mine != theirs and (not name.endswith(".pt") or not same_tensors(theirs, mine)):
            problems.append(f"file {name} differs")
    return problems


def warning_differences(first: Outcome, second: Outcome) -> list[str]:
    """The warnings ``second`` issued that ``first`` did not, and those it did not issue."""
    mine, theirs = Counter(second.warnings), Counter(first.warnings)
    return _warning_lines("issued", mine - theirs, second) + _warning_lines(
        "did not issue", theirs - mine, first
    )


def _warning_lines(verb: str, warned: Counter[Warned], run: Outcome) -> list[str]:
    if not warned:
        return []
    shown = set(shown_by_default(run.warnings))
    lines = [
        f"  {w} (x{n}; {'shown by default' if w in shown else 'only under -W always'})"
        for w, n in sorted(warned.items())
    ]
    return [f"{verb} {sum(warned.values())} warning(s) the other run did not:\n" + "\n".join(lines)]


def shown_by_default(warned: list[Warned]) -> list[Warned]:
    """The warnings Python's default filters show: the first of each at its location, none
    of the kinds they ignore there."""
    shown: dict[Warned, None] = {}
    for w in warned:
        if not w.hidden_by_default:
            shown.setdefault(w)
    return list(shown)


def _event_problems(guarded: Outcome, expected: Expectation) -> list[str]:
    logged = sorted(f"{e.get('guard')}/{e.get('action')}" for e in guarded.events)
    for optional in expected.maybe:
        if optional in logged and logged.count(optional) > expected.events.count(optional):
            logged.remove(optional)
    problems = []
    if logged != sorted(expected.events):
        problems.append(f"events {logged}, expected {sorted(expected.events)}: {guarded.events}")
    for event in guarded.events:
        match = CALLSITE.match(str(event.get("callsite", "")))
        if match and not match["file"].startswith(str(guarded.folder)):
            problems.append(f"call site {event['callsite']} is not in the program's own code")
    return problems


def _stderr_problems(guarded: Outcome, expected: Expectation) -> list[str]:
    lines = [line for line in guarded.stderr.splitlines() if line.startswith("autograd-guard")]
    allowed = expected.stderr
    unexpected = [line for line in lines if allowed is None or allowed not in line]
    return [f"unexpected stderr lines {unexpected}"] if unexpected else []


def same_tensors(first: bytes, second: bytes) -> bool:
    """Two ``torch.save`` files hold equal objects, tensors bit for bit."""
    import torch

    def load(data: bytes) -> Any:
        return torch.load(io.BytesIO(data), weights_only=False)

    return _same(load(first), load(second))


def _same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.requires_grad == b.requires_grad
            and _bytes(a) == _bytes(b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def _bytes(tensor: Any) -> bytes:
    """The values' bytes (NaN payloads and signed zeros included)."""
    import torch

    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy()) if flat.numel() else b""
