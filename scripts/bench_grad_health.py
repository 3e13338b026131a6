"""Per-step cost of the grad_health guard on a small training loop, side by side.

An MLP 16-256-256-1, batch 64, Adam, on the CPU (a step of ~0.7 ms on a 2-core machine;
the goal was set for ~3 ms), and the same at batch 1024: steps with the guard installed
and without it alternate in blocks, and the table holds the median per-step time of each.
The localising steps (armed only after a non-finite gradient) are quoted apart, against
``torch.autograd.detect_anomaly`` on the same loop. Where CUDA is available, one more row:
a step of >= 5 ms on the GPU (MLP 1024-4096-4096-1, batch 8192).

    python scripts/bench_grad_health.py [--steps 50 --blocks 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from benchtable import Row, print_table

import autograd_guard
from autograd_guard._grad_probe import BackwardProbe

warnings.filterwarnings("ignore", "Anomaly Detection has been enabled")


def loop(
    batch: int = 64, sizes: tuple[int, int] = (16, 256), device: str = "cpu"
) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    inputs, width = sizes
    model = torch.nn.Sequential(
        torch.nn.Linear(inputs, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 1),
    ).to(device)
    return (
        model,
        torch.optim.Adam(model.parameters(), lr=1e-3),
        torch.randn(batch, inputs, device=device),
        torch.randn(batch, 1, device=device),
    )


def per_step(steps: int, context: str = "") -> float:
    if context == "cuda":
        model, optimizer, x, y = loop(8192, (1024, 4096), "cuda")
    else:
        model, optimizer, x, y = loop(1024 if context == "large" else 64)
    anomaly = torch.autograd.detect_anomaly() if context == "anomaly" else None
    probe = BackwardProbe(10**9) if context == "probe" else None
    if anomaly is not None:
        anomaly.__enter__()
    if probe is not None:
        probe.arm()
    try:
        for step in range(steps + 5):  # five warm-up steps (Adam's state is made)
            if step == 5:
                _synchronize(context)
                start = time.perf_counter()
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        _synchronize(context)
        return (time.perf_counter() - start) / steps * 1e3
    finally:
        if anomaly is not None:
            anomaly.__exit__(None, None, None)
        if probe is not None:
            probe.disarm()


def _synchronize(context: str) -> None:
    if context == "cuda":
        torch.cuda.synchronize()


def blocks(cases: dict[str, str], steps: int, count: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for block in range(count):
        order = list(cases.items()) if block % 2 else list(cases.items())[::-1]
        for name, context in order:
            if name.startswith("guarded"):
                autograd_guard.install({})
            try:
                samples[name].append(per_step(steps, context))
            finally:
                autograd_guard.uninstall()
    return {name: statistics.median(values) for name, values in samples.items()}


def measure(steps: int = 50, count: int = 15) -> list[Row]:
    times = blocks({"bare": "", "guarded": ""}, steps, count)
    large = blocks({"bare": "large", "guarded": "large"}, steps // 2, count)
    local = blocks({"bare": "", "anomaly": "anomaly", "guarded probe": "probe"}, steps, 5)
    case = "MLP 16-256-256-1, batch 64, Adam, CPU"
    rows = []
    if torch.cuda.is_available():
        gpu = blocks({"bare": "cuda", "guarded": "cuda"}, steps, count)
        rows.append(
            Row(
                "grad",
                "MLP 1024-4096-4096-1, batch 8192, Adam, CUDA: guarded vs bare",
                gpu["bare"],
                gpu["guarded"],
                "ms",
                "<= 1.02x",
            )
        )
    return [
        Row(
            "grad",
            f"{case}: step guarded vs bare",
            times["bare"],
            times["guarded"],
            "ms",
            "<= 1.05x",
        ),
        Row(
            "grad",
            "the same MLP, batch 1024 (a ~2.4 ms step): guarded vs bare",
            large["bare"],
            large["guarded"],
            "ms",
            "<= 1.05x",
        ),
        Row(
            "grad",
            f"{case}: localising step vs bare",
            local["bare"],
            local["guarded probe"],
            "ms",
            "after a NaN only",
        ),
        Row(
            "grad",
            f"{case}: detect_anomaly step vs bare",
            local["bare"],
            local["anomaly"],
            "ms",
            "for scale",
        ),
        Row(
            "grad",
            f"{case}: localising step vs detect_anomaly",
            local["anomaly"],
            local["guarded probe"],
            "ms",
            "",
        ),
        *rows,
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--blocks", type=int, default=15)
    args = parser.parse_args()
    print_table(
        measure(args.steps, args.blocks),
        f"grad_health: medians of {args.blocks} blocks of {args.steps} steps",
    )


if __name__ == "__main__":
    main()
