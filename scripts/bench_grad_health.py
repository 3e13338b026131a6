"""Per-step cost of the grad_health guard on a small training loop, side by side.

An MLP 16-256-256-1, batch 64, Adam, on the CPU (a step of ~0.7 ms on a 2-core machine),
and the same at batch 1024 (a ~2.5 ms step): steps with the guard installed and without
it alternate in blocks, in one process, and the table holds the median per-step time of
each. Also quoted: the same loop with a closure passed to every step (as Lightning does),
and fused Adam with the guard's flag lent to the optimizer on the CPU (the CPU twin of the
CUDA path, where torch has fused Adam for the CPU). The localising steps (armed only after
a non-finite gradient) are quoted apart, against ``torch.autograd.detect_anomaly``; so is
a repairing step (after repair has begun: one node of each pass mended, its flag and the
loss kept on the device and read once ready), guarded either way. Where
CUDA is available, three more rows on the GPU: a step of >= 5 ms (MLP 1024-4096-4096-1,
batch 8192) with fused Adam (the flag stays on the device, no host sync) and with Adam's
default foreach step (the flag read, one sync per step), and a short step (the CPU's MLP,
batch 1024) with foreach Adam, where that sync weighs most.

    python scripts/bench_grad_health.py [--steps 50 --blocks 15 --threads N --cuda-only --short]
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
from autograd_guard.guards.grad_health import check as _grad_check
from autograd_guard.guards.grad_health import probe as _grad_probe
from autograd_guard.guards.grad_health.made import node_key
from autograd_guard.guards.grad_health.mending import Repairer
from autograd_guard.guards.grad_health.probe import BackwardProbe

warnings.filterwarnings("ignore", "Anomaly Detection has been enabled")

# Wall time; on a machine shared with other jobs, the process's CPU time (--clock cpu,
# with --threads 1) leaves out the time spent waiting for a core.
CLOCK = [time.perf_counter]


def loop(
    batch: int = 64, sizes: tuple[int, int] = (16, 256), device: str = "cpu", fused: bool = False
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
        torch.optim.Adam(model.parameters(), lr=1e-3, **({"fused": True} if fused else {})),
        torch.randn(batch, inputs, device=device),
        torch.randn(batch, 1, device=device),
    )


# Steps before the timed ones: Adam's state is made, and the guard's first steps (the
# lost-gradient window's bookkeeping, the forward watch) are behind (--warm-up 5 times them too).
WARM_UP = [25]


def per_step(steps: int, context: str = "") -> float:
    if context.startswith("cuda"):
        batch, sizes = (1024, (16, 256)) if context == "cuda-small" else (8192, (1024, 4096))
        model, optimizer, x, y = loop(batch, sizes, "cuda", fused=context == "cuda")
    else:
        model, optimizer, x, y = loop(1024 if context == "large" else 64, fused=context == "fused")
    anomaly = torch.autograd.detect_anomaly() if context == "anomaly" else None
    # as the guard arms it once torch._dynamo is imported: its hooks disabled for Dynamo
    probe = BackwardProbe(10**9, 10**9, torch._dynamo.disable) if context == "probe" else None
    repairer = repairing(model, x, y) if context == "repair" else None
    if anomaly is not None:
        anomaly.__enter__()
    if probe is not None:
        probe.arm()
    try:
        for step in range(steps + WARM_UP[0]):
            if step == WARM_UP[0]:
                _synchronize(context)
                start = CLOCK[0]()
            if context == "closure":
                optimizer.step(lambda: closure(model, optimizer, x, y))
                continue
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            if repairer is not None:
                repairer.drain()  # as the guard does after each step
        _synchronize(context)
        return (CLOCK[0]() - start) / steps * 1e3
    finally:
        if anomaly is not None:
            anomaly.__exit__(None, None, None)
        if probe is not None:
            probe.disarm()
        if repairer is not None:
            repairer.disarm()


def repairing(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> Repairer:
    """A repairer armed for the output layer's backward node (as once repair has begun at
    an op there): every pass mends that node's outputs."""
    loss = torch.nn.functional.mse_loss(model(x), y)
    repairer = Repairer(torch._dynamo.disable)
    repairer.keys.add(node_key(loss.grad_fn.next_functions[0][0]))
    repairer.arm()
    return repairer


def closure(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss


def fused_on_cpu() -> bool:
    try:
        torch.optim.Adam([torch.nn.Parameter(torch.ones(1))], fused=True)
    except RuntimeError:
        return False
    return True


def _synchronize(context: str) -> None:
    if context.startswith("cuda"):
        torch.cuda.synchronize()


# The guard's policy in a block whose name says "no zero check"
NO_ZERO_CHECK = {"guards": {"grad_health": {"zero_steps": 0}}}


def blocks(cases: dict[str, str], steps: int, count: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for block in range(count):
        order = list(cases.items()) if block % 2 else list(cases.items())[::-1]
        for name, context in order:
            if name.startswith("guarded"):
                autograd_guard.install(NO_ZERO_CHECK if "no zero check" in name else {})
            try:
                samples[name].append(per_step(steps, context))
            finally:
                autograd_guard.uninstall()
    return {name: statistics.median(values) for name, values in samples.items()}


CASE = "MLP 16-256-256-1, batch 64, Adam, CPU"


def side_by_side(name: str, context: str, steps: int, count: int, goal: str = "") -> Row:
    """One row: the same loop bare and guarded, alternating in blocks."""
    times = blocks({"bare": context, "guarded": context}, steps, count)
    return Row("grad", name, times["bare"], times["guarded"], "ms", goal)


def measure(steps: int = 50, count: int = 15) -> list[Row]:
    _grad_probe.SECONDS = 1e6  # the probe's timer must not end the localising blocks
    rows = [
        side_by_side(f"{CASE}: step guarded vs bare", "", steps, count, "<= 1.05x"),
        side_by_side(
            "the same MLP, batch 1024 (~2.5 ms at 2 threads): guarded vs bare",
            "large",
            steps // 2,
            count,
            "<= 1.01x",
        ),
        side_by_side(f"{CASE}, a closure every step: guarded vs bare", "closure", steps, count),
    ]
    if fused_on_cpu():  # the CPU twin of the CUDA path: the flag lent, read after the step
        _grad_check.DEFERRED_DEVICE_TYPES.add("cpu")
        try:
            rows.append(
                side_by_side(f"{CASE}, fused, flag lent (CUDA path)", "fused", steps, count)
            )
        finally:
            _grad_check.DEFERRED_DEVICE_TYPES.discard("cpu")
    times = blocks({"guarded, no zero check": "", "guarded": ""}, steps, count)
    rows.append(
        Row(
            "grad",
            f"{CASE}: with the zero-gradient probe vs zero_steps = 0",
            times["guarded, no zero check"],
            times["guarded"],
            "ms",
            "<= 1.01x",
        )
    )
    rows += localising_rows(steps)
    if torch.cuda.is_available():
        rows += cuda_rows(steps, count)
    return rows


# On CUDA: fused Adam takes the flag on the device (no host sync); Adam's default (foreach)
# step reads it, one sync per step, which a short step feels most.
CUDA_CASES = (
    ("MLP 1024-4096-4096-1, batch 8192, fused Adam, CUDA", "cuda", "<= 1.02x"),
    ("MLP 1024-4096-4096-1, batch 8192, Adam (foreach), CUDA", "cuda-foreach", "<= 1.05x"),
    ("MLP 16-256-256-1, batch 1024, Adam (foreach), CUDA", "cuda-small", "for scale"),
)


def cuda_rows(steps: int, count: int) -> list[Row]:
    return [
        side_by_side(f"{name}: guarded vs bare", context, steps, count, target)
        for name, context, target in CUDA_CASES
    ]


def localising_rows(steps: int) -> list[Row]:
    local = blocks(
        {"bare": "", "anomaly": "anomaly", "guarded probe": "probe", "guarded repair": "repair"},
        steps,
        5,
    )
    bare, anomaly, probe = local["bare"], local["anomaly"], local["guarded probe"]
    return [
        Row("grad", f"{CASE}: repairing step vs bare", bare, local["guarded repair"], "ms"),
        Row("grad", f"{CASE}: localising step vs bare", bare, probe, "ms", "after a NaN only"),
        Row("grad", f"{CASE}: detect_anomaly step vs bare", bare, anomaly, "ms", "for scale"),
        Row("grad", f"{CASE}: localising step vs detect_anomaly", anomaly, probe, "ms"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's own)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    parser.add_argument("--cuda-only", action="store_true", help="the CUDA rows alone")
    parser.add_argument("--short", action="store_true", help="the short CPU step's row alone")
    parser.add_argument(
        "--warm-up", type=int, default=WARM_UP[0], help="steps before the timed ones"
    )
    args = parser.parse_args()
    WARM_UP[0] = args.warm_up
    if args.clock == "cpu":
        CLOCK[0] = time.process_time
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = cuda_rows(args.steps, args.blocks) if args.cuda_only else None
    if args.short:
        rows = [side_by_side(f"{CASE}: step guarded vs bare", "", args.steps, args.blocks)]
    print_table(
        rows if rows is not None else measure(args.steps, args.blocks),
        f"grad_health: medians of {args.blocks} blocks of {args.steps} steps after "
        f"{args.warm_up}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} time",
    )


if __name__ == "__main__":
    main()
