"""Per-step cost of grad_health on a 2-rank DDP job (gloo, CPU), side by side.

Both ranks run the same MLP as bench_grad_health (16-256-256-1, batch 64, Adam) under
DistributedDataParallel, in blocks that alternate unguarded and guarded on both ranks in
lockstep (the guard adds one all-reduce of a 2-element flag per step: a rank guarded alone
would wait for the other). Rank 0's per-step time: the median of each pair of blocks'
ratios, and the medians of each side.

    python scripts/bench_grad_health_ddp.py [--steps 50 --blocks 15]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from benchtable import Row, print_table

CASE = "2-rank DDP (gloo), MLP 16-256-256-1, batch 64, Adam: step guarded vs bare"


def _block(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> float:
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    for step in range(steps + 3):
        if step == 3:
            dist.barrier()
            start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    dist.barrier()
    return (time.perf_counter() - start) / steps * 1e3


def _worker(rank: int, port: int, steps: int, count: int, out: str) -> None:
    import autograd_guard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(
            torch.nn.Linear(16, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 1),
        )
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    pairs: list[tuple[float, float]] = []
    for block in range(count):
        times = {}
        for guarded in (False, True) if block % 2 else (True, False):
            if guarded:
                autograd_guard.install({"log": os.devnull})
            try:
                times[guarded] = _block(model, optimizer, steps)
            finally:
                autograd_guard.uninstall()
        pairs.append((times[False], times[True]))
    if rank == 0:
        Path(out).write_text("\n".join(f"{a} {b}" for a, b in pairs))
    dist.destroy_process_group()


def measure(steps: int = 50, count: int = 15) -> list[Row]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "pairs.txt")
        mp.spawn(_worker, args=(port, steps, count, out), nprocs=2)
        pairs = [tuple(map(float, line.split())) for line in Path(out).read_text().split("\n")]
    bare = statistics.median(p[0] for p in pairs)
    ratio = statistics.median(p[1] / p[0] for p in pairs)
    return [Row("grad", CASE, bare, bare * ratio, "ms", "<= 1.05x (median of pairs)")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--blocks", type=int, default=15)
    args = parser.parse_args()
    print_table(
        measure(args.steps, args.blocks),
        f"grad_health on DDP: {args.blocks} pairs of blocks of {args.steps} steps, "
        f"torch {torch.__version__}, 1 thread per rank",
    )


if __name__ == "__main__":
    main()
