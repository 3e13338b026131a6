"""Per-step cost of grad_health on a 2-rank DDP job (gloo, CPU), side by side, over step
sizes.

Both ranks run an MLP (16-W-W-1, batch 64, Adam) under DistributedDataParallel for each
width W, in blocks of four kinds that alternate in lockstep on both ranks: unguarded,
guarded (plain DDP: each rank decides on its own gradients, which DDP made the same, with
no exchange), unguarded plus one all-reduce of 6 float64 values per step on a gloo group
of its own (what the guard's exchange is), and guarded with ``exchange_ddp = true`` (one
exchange per step, as ZeRO, FSDP, tensor parallel and pipelining steps have).
Rank 0's per-step time: per width, the median over rounds of the unguarded block, and for
each other kind the median of each round's ratio to the unguarded block of its round.

Host reads per step (what is a host sync on CUDA): the guard reads one flag of the local
gradients (with its zero-gradient probe) on the host (and, with the exchange, exchanges
it on the CPU); no other read of a gradient per step.

    python scripts/bench_grad_health_ddp.py [--widths 256 512 1024 --steps 30 --blocks 9]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from benchtable import Row, print_table

BARE, GUARDED, REDUCE, EXCHANGED = "bare", "guarded", "bare + 1 all-reduce", "exchanged"
KINDS = (BARE, GUARDED, REDUCE, EXCHANGED)
POLICIES = {
    GUARDED: {"log": os.devnull},
    # the guard exchanging at each step, as it does where gradients differ across ranks
    EXCHANGED: {"log": os.devnull, "guards": {"grad_health": {"exchange_ddp": True}}},
}


def _block(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, pg: object
) -> float:
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    flags = torch.zeros(6, dtype=torch.float64)
    for step in range(steps + 3):
        if step == 3:
            dist.barrier()
            start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if pg is not None:
            pg.allreduce([flags]).wait()  # type: ignore[attr-defined]
        optimizer.step()
    dist.barrier()
    return (time.perf_counter() - start) / steps * 1e3


def _model(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(
            torch.nn.Linear(16, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, width),
            torch.nn.ReLU(),
            torch.nn.Linear(width, 1),
        )
    )


def _worker(rank: int, port: int, args: argparse.Namespace, out: str) -> None:
    import autograd_guard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    store = dist.PrefixStore("bench/", dist.distributed_c10d._get_default_store())
    pg = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=60))
    lines = []
    for width in args.widths:
        model = _model(width)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for block in range(args.blocks):
            kinds = KINDS[block % 4 :] + KINDS[: block % 4]  # each kind first in turn
            times = {}
            for kind in kinds:
                if kind in POLICIES:
                    autograd_guard.install(POLICIES[kind])
                try:
                    times[kind] = _block(
                        model, optimizer, args.steps, pg if kind == REDUCE else None
                    )
                finally:
                    autograd_guard.uninstall()
            lines.append(f"{width} " + " ".join(str(times[kind]) for kind in KINDS))
    if rank == 0:
        Path(out).write_text("\n".join(lines))
    dist.destroy_process_group()


def measure(args: argparse.Namespace) -> list[Row]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "times.txt")
        mp.spawn(_worker, args=(port, args, out), nprocs=2)
        rounds = [line.split() for line in Path(out).read_text().split("\n")]
    rows = []
    for width in args.widths:
        mine = [tuple(map(float, r[1:])) for r in rounds if int(r[0]) == width]
        bare = statistics.median(r[0] for r in mine)
        # each kind against the unguarded block of its own round (the machine drifts)
        guarded, reduce, exchanged = (
            bare * statistics.median(r[k] / r[0] for r in mine) for k in (1, 2, 3)
        )
        case = f"2-rank DDP (gloo), MLP 16-{width}-{width}-1, batch 64, Adam"
        rows.append(Row("grad", case, bare, guarded, "ms", "<= 1.05x at >= 10 ms"))
        rows.append(Row("grad", case + " + 1 all-reduce", bare, reduce, "ms", "reference"))
        rows.append(
            Row("grad", case + ", exchange_ddp = true", bare, exchanged, "ms", "one exchange")
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--widths", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--blocks", type=int, default=9)
    args = parser.parse_args()
    print_table(
        measure(args),
        f"grad_health on DDP: {args.blocks} rounds of blocks of {args.steps} steps per width, "
        f"torch {torch.__version__}, 1 thread per rank",
    )


if __name__ == "__main__":
    main()
