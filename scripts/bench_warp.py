"""wp.launch wrapped by the warp_torch_args guard vs bare, side by side in one process; and
the warp_tape guard alone: a launch with no tape, a recording tape of 10 launches, the
copy-on-write of an overwritten array, and a backward() with nothing overwritten.

Runs one child per Warp version (1.5.1, affected; the newest, with the guard forced on so
that its wrapper is in place). Each child alternates blocks of launches with the guard
installed and uninstalled, and reports the median per-call time of each.

    python scripts/bench_warp.py [--calls 2000 --blocks 15] [--only tape --clock cpu]
        [--warp 1.5.1 1.19.0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import thirdparty  # noqa: E402
from benchtable import Row, print_table  # noqa: E402

CHILD = r"""
import json, statistics, sys, time, torch
import autograd_guard
import warp as wp
wp.config.quiet = True
wp.init()
calls, blocks = {calls}, {blocks}

@wp.kernel
def k(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid(); y[i] = x[i] * 2.0

x = torch.ones(10); y = torch.zeros(10)
wx, wy = wp.from_torch(x), wp.from_torch(y)
policy = {{"guards": {{"warp_torch_args": {{"force": True}}}}}}

def per_call(fn, tape=False):
    t = wp.Tape() if tape else None
    if t is not None:
        with t:
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            elapsed = time.perf_counter() - start
    else:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
    return elapsed / calls * 1e6

cases = {{
    "launch, no tape": (lambda: wp.launch(k, dim=10, inputs=[wx], outputs=[wy], device="cpu"), False),
    "launch, tape recording": (lambda: wp.launch(k, dim=10, inputs=[wx], outputs=[wy], device="cpu"), True),
}}
results = {{}}
for name, (fn, tape) in cases.items():
    fn(); bare, wrapped = [], []
    for block in range(blocks):  # alternate which goes first
        for guarded in ((False, True) if block % 2 else (True, False)):
            if guarded:
                autograd_guard.install(policy); wrapped.append(per_call(fn, tape))
            else:
                autograd_guard.uninstall(); bare.append(per_call(fn, tape))
    results[name] = (statistics.median(bare), statistics.median(wrapped))
autograd_guard.install(policy)
# convert (guard) vs the user's own wp.from_torch, both under a tape
by_hand = lambda: wp.launch(k, dim=10, inputs=[wp.from_torch(x)], outputs=[wy], device="cpu")
guarded = lambda: wp.launch(k, dim=10, inputs=[x], outputs=[wy], device="cpu")
by_hand(); guarded()
hand, conv = [], []
for block in range(blocks):
    for which in ((0, 1) if block % 2 else (1, 0)):
        if which:
            conv.append(per_call(guarded, True))
        else:
            hand.append(per_call(by_hand, True))
results["convert vs hand-written wp.from_torch, tape"] = (statistics.median(hand), statistics.median(conv))
print(json.dumps({{"version": wp.config.version, "results": results}}))
"""


# warp_tape alone (the other Warp guards off): each case is timed per block of `reps`
# repetitions, guarded and bare blocks alternating.
TAPE_CHILD = r"""
import json, statistics, time
import numpy as np
import autograd_guard
import warp as wp
wp.config.quiet = True
wp.init()
reps, blocks = {reps}, {blocks}
clock = time.{clock}  # perf_counter (wall) or thread_time (this thread's CPU time)

@wp.kernel
def k(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid(); y[i] = x[i] * 2.0

policy = {{"disable": ["warp_torch_args", "warp_copy_adjoint"]}}

def chain(n):
    return [wp.zeros(n, dtype=float, requires_grad=True) for _ in range(11)]

def record(xs):
    tape = wp.Tape()
    with tape:
        for i in range(10):
            wp.launch(k, dim=xs[0].shape[0], inputs=[xs[i]], outputs=[xs[i + 1]], device="cpu")
    return tape

small = chain(10)
def no_tape():
    for i in range(10):
        wp.launch(k, dim=10, inputs=[small[i]], outputs=[small[i + 1]], device="cpu")
    return 10

def tape_of_10():
    record(small)
    return 10

def overwrite(n):
    xs, other = chain(n), wp.zeros(n, dtype=float)
    def case():
        tape = record(xs)  # launch 6 read xs[5]: the launch below overwrites it
        start = clock()
        wp.launch(k, dim=n, inputs=[other], outputs=[xs[5]], device="cpu")
        elapsed = clock() - start
        tape.reset()
        return elapsed
    return case

def backward():
    tape = record(small)
    start = clock()
    tape.backward(grads={{small[10]: wp.ones(10, dtype=float)}})
    elapsed = clock() - start
    tape.zero()
    return elapsed

def timed(fn):
    start = clock()
    per = 0.0
    for _ in range(reps):
        out = fn()
        per += out if isinstance(out, float) else 0.0
    total = clock() - start
    count = out if isinstance(out, int) else 1
    return (total if per == 0.0 else per) / reps / count * 1e6

# The floor: the same tape with a check that notes nothing, sees no write and mends
# nothing (what any per-launch Python check costs here, before its own work): wp.launch's
# prelude calling a hook that returns at once, or the wrapper's check where it is wrapped.
from autograd_guard.guards.warp_tape import WarpTape
noting, hook = WarpTape._launch_check, WarpTape._launch_prelude
FLOOR = "warp_tape: tape of 10 launches recording, per launch, floor: a check doing nothing"

cases = {{
    "warp_tape: launch, no tape, per launch": no_tape,
    "warp_tape: tape of 10 launches recording, per launch": tape_of_10,
    FLOOR: tape_of_10,
    "warp_tape: copy-on-write, overwritten array of 10 floats": overwrite(10),
    "warp_tape: copy-on-write, overwritten array of 1M floats": overwrite(1_000_000),
    "warp_tape: backward() of 10 launches, nothing overwritten": backward,
}}
results = {{}}
for name, fn in cases.items():
    floor = name == FLOOR
    WarpTape._launch_check = (lambda self, instance, args, kwargs: False) if floor else noting
    WarpTape._launch_prelude = (lambda self, kernel, inputs, *rest: inputs) if floor else hook
    autograd_guard.install(policy); timed(fn); autograd_guard.uninstall(); timed(fn)
    bare, guarded = [], []
    for block in range(blocks):
        for on in ((False, True) if block % 2 else (True, False)):
            # one untimed call after each switch: a new install reads each kernel's
            # arguments and recompiles wp.launch, once a process in real use
            if on:
                autograd_guard.install(policy); fn(); guarded.append(timed(fn))
            else:
                autograd_guard.uninstall(); fn(); bare.append(timed(fn))
    results[name] = (statistics.median(bare), statistics.median(guarded))
print(json.dumps({{"version": wp.config.version, "results": results}}))
"""
CLOCKS = {"wall": "perf_counter", "cpu": "thread_time"}
TAPE_GOALS = {"warp_tape: tape of 10 launches recording, per launch": "<= +1.5 us"}


def _child_env(version: str, cache: str) -> dict[str, str]:
    """A benchmark child's environment: this Warp version first on its path, no auto-load."""
    env = {
        **os.environ,
        "PYTHONPATH": thirdparty.first_on_path(thirdparty.install(f"warp-{version}")),
        "WARP_CACHE_PATH": cache,
    }
    env.pop("AUTOGRAD_GUARD", None)
    return env


def _child(version: str, source: str, cache: str) -> dict:
    env = _child_env(version, cache)
    script = Path(cache) / "bench_child.py"  # Warp reads kernel source from a file
    script.write_text(source)
    child = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True)
    if child.returncode:
        sys.exit(f"warp {version} benchmark failed:\n{child.stderr}")
    return json.loads(child.stdout.strip().splitlines()[-1])


VERSIONS = ("1.5.1", "1.16.0", "1.19.0")


def measure_tape(
    reps: int = 200, blocks: int = 11, clock: str = "wall", versions: tuple[str, ...] = VERSIONS
) -> list[Row]:
    cache = tempfile.mkdtemp(prefix="warp-cache-")
    rows = []
    for version in versions:
        result = _child(
            version, TAPE_CHILD.format(reps=reps, blocks=blocks, clock=CLOCKS[clock]), cache
        )
        for name, (base, guarded) in result["results"].items():
            case = f"{result['version']} {name}"
            rows.append(Row("warp", case, base, guarded, "us", TAPE_GOALS.get(name, "")))
    return rows


def measure(calls: int = 2000, blocks: int = 15, versions: tuple[str, ...] = VERSIONS) -> list[Row]:
    cache = tempfile.mkdtemp(prefix="warp-cache-")
    rows = []
    goals = {"launch, no tape": "<= +1.5 us, ~<= 1.15x"}
    for version in versions:
        env = _child_env(version, cache)
        script = Path(cache) / "bench_child.py"  # Warp reads kernel source from a file
        script.write_text(CHILD.format(calls=calls, blocks=blocks))
        child = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True
        )
        if child.returncode:
            sys.exit(f"warp {version} benchmark failed:\n{child.stderr}")
        result = json.loads(child.stdout.strip().splitlines()[-1])
        for name, (base, guarded) in result["results"].items():
            rows.append(
                Row("warp", f"{result['version']} {name}", base, guarded, "us", goals.get(name, ""))
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--only", choices=("torch_args", "tape"), default=None)
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="the tape rows' clock (cpu: "
        "this thread's CPU time, steadier on a machine shared with other work)",
    )
    parser.add_argument(
        "--warp",
        nargs="+",
        choices=VERSIONS,
        default=VERSIONS,
        help="the Warp versions to run (installed in thirdparty's cache on first use)",
    )
    args = parser.parse_args()
    versions = tuple(args.warp)
    if args.only != "tape":
        print_table(
            measure(args.calls, args.blocks, versions),
            "wp.launch of a trivial kernel, dim=10, CPU: bare vs wrapped (guard forced on)",
        )
    if args.only != "torch_args":
        print_table(
            measure_tape(max(args.calls // 10, 20), args.blocks, args.clock, versions),
            "warp_tape alone, CPU: bare vs guarded (medians of interleaved blocks)",
        )


if __name__ == "__main__":
    main()
