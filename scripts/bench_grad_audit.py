"""grad_audit's cost, side by side: the steady state (after each Function class's first
calls, ``Function.apply`` costs one dict lookup more) and the one-off audit.

- per call: ``Tanh.apply`` (a small Python Function, tests/grad_audit_corpus.py) on a 64 x
  64 input requiring grad, forward only, unguarded and guarded after its audits, calls
  alternating in blocks in one process; the median per call. And the wrapper alone:
  ``Relu.apply`` on 4 values through the wrapper against torch's own ``apply`` called
  directly, alternating every 100 calls;
- per step: a training step (an MLP 64-256-64 whose activation is that Function, batch 64,
  Adam), after the audits;
both with grad_audit off and on, every other guard on in both (grad_health's step cost is
``bench_grad_health.py``'s);
- one-off: the first call and its backward with the audit (the re-runs: one at the point,
  one in float64, four per input) against the same call and backward unguarded; the extra
  memory is the copies of the inputs and the re-runs' outputs (six outputs per input).

    python scripts/bench_grad_audit.py [--calls 2000 --blocks 15 --threads 1 --min]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import grad_audit_corpus as corpus
import torch
from benchtable import Row, print_table

import autograd_guard


def per_call(calls: int, function, *args: torch.Tensor) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        function.apply(*args)
    return (time.perf_counter() - start) / calls


def wrapper_alone(calls: int, blocks: int, function, *args: torch.Tensor) -> tuple[float, float]:
    """torch's own ``apply`` called directly against ``function.apply`` through the wrapper
    (its class done), alternating every ``calls`` calls in one install: the wrapper's own
    cost, with the machine's load drifting alike on both sides."""
    autograd_guard.install(GUARDED)
    try:
        original = vars(torch.autograd.Function)["apply"].__func__.__wrapped__
        for _ in range(64):
            function.apply(*args)  # its first calls: looked at, then done
        plain, guarded = [], []
        for _ in range(blocks * 20):
            start = time.perf_counter()
            for _ in range(calls):
                original(function, *args)
            middle = time.perf_counter()
            for _ in range(calls):
                function.apply(*args)
            plain.append((middle - start) / calls)
            guarded.append((time.perf_counter() - middle) / calls)
    finally:
        autograd_guard.uninstall()
    return REDUCE(plain), REDUCE(guarded)


def make_step():
    torch.manual_seed(0)
    first, second = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)
    params = [*first.parameters(), *second.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-3)
    scale = torch.ones(256)
    data = torch.randn(64, 64)

    def step() -> None:
        optimizer.zero_grad()
        hidden = corpus.Tanh.apply(first(data), scale)
        second(hidden).pow(2).mean().backward()
        optimizer.step()

    return step


def timed(function, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        function()
    return (time.perf_counter() - start) / repeat


REDUCE = statistics.median  # or min (--min), on a machine shared with other jobs
BASELINE = {"mode": "observe", "disable": ["grad_audit"]}  # every other guard as usual
GUARDED = {"mode": "observe"}


def side_by_side(measure, blocks: int) -> tuple[float, float]:
    """Medians of ``measure()`` with grad_audit off and on (the other guards on in both),
    in alternating blocks."""
    plain, guarded = [], []
    for _ in range(blocks):
        for policy, times in ((BASELINE, plain), (GUARDED, guarded)):
            autograd_guard.install(policy)
            try:
                measure()  # the first calls: audited, not timed
                times.append(measure())
            finally:
                autograd_guard.uninstall()
    return REDUCE(plain), REDUCE(guarded)


def one_off(blocks: int) -> tuple[float, float]:
    x = torch.randn(64, 64, requires_grad=True)
    w = torch.randn(64, requires_grad=True)

    def first_call() -> None:
        corpus.Tanh.apply(x, w).sum().backward()

    plain, audited = [], []
    for _ in range(blocks):
        plain.append(timed(first_call, 1))
        autograd_guard.install({"mode": "observe"})
        try:
            audited.append(timed(first_call, 1))
        finally:
            autograd_guard.uninstall()
    return REDUCE(plain), REDUCE(audited)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min", action="store_true", help="the fastest block, not the median")
    args = parser.parse_args()
    global REDUCE
    REDUCE = min if args.min else statistics.median
    torch.set_num_threads(args.threads)
    x = torch.randn(64, 64, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    call = side_by_side(lambda: per_call(args.calls, corpus.Tanh, x, w), args.blocks)
    tiny = torch.randn(4, requires_grad=True)
    cheap = wrapper_alone(100, args.blocks, corpus.Relu, tiny)
    step = make_step()
    steps = side_by_side(lambda: timed(step, 50), args.blocks)
    audit = one_off(args.blocks)
    rows = [
        Row(
            "grad_audit",
            "Tanh.apply (64 x 64) after the audits, per call",
            *(t * 1e6 for t in call),
            "us",
            "within noise",
        ),
        Row(
            "grad_audit",
            "Relu.apply (4 values), the wrapper alone, interleaved",
            *(t * 1e6 for t in cheap),
            "us",
            "one dict lookup",
        ),
        Row(
            "grad_audit",
            "training step with a Function, after the audits",
            *(t * 1e3 for t in steps),
            "ms",
            "<= 1.05x",
        ),
        Row(
            "grad_audit",
            "first call + backward, audited (one-off, 10 forwards)",
            *(t * 1e3 for t in audit),
            "ms",
            "once per class, 3 at most",
        ),
    ]
    reduce = "fastest" if args.min else "median"
    title = f"grad_audit: {reduce} of {args.blocks} blocks, torch {torch.__version__}, {args.threads} thread"
    print_table(rows, title)


if __name__ == "__main__":
    main()
