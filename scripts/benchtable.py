"""One table format for every benchmark: rows of (benchmark, case, baseline, guarded,
unit, goal), printed with the difference and the ratio guarded / baseline."""

from __future__ import annotations

import math
from typing import NamedTuple


class Row(NamedTuple):
    benchmark: str
    case: str
    baseline: float
    guarded: float
    unit: str
    goal: str = ""


def print_table(rows: list[Row], title: str = "") -> None:
    if title:
        print(title)
    print(
        f"{'benchmark':<10} {'case':<60} {'baseline':>11} {'guarded':>11} {'delta':>10}"
        f" {'ratio':>8}  goal"
    )
    for row in rows:
        if math.isnan(row.baseline):
            delta = ratio = "-"
            baseline = "-"
        else:
            baseline = f"{row.baseline:.3g} {row.unit}"
            delta = f"{row.guarded - row.baseline:+.3g}"
            ratio = f"{row.guarded / row.baseline:.3f}x" if row.baseline else "-"
        guarded = "-" if math.isnan(row.guarded) else f"{row.guarded:.3g} {row.unit}"
        print(
            f"{row.benchmark:<10} {row.case:<60} {baseline:>11} {guarded:>11} {delta:>10}"
            f" {ratio:>8}  {row.goal}"
        )
