"""wp.launch wrapped by the warp_torch_args guard vs bare, side by side in one process.

Runs one child per Warp version (1.5.1, affected; the newest, with the guard forced on so
that its wrapper is in place). Each child alternates blocks of launches with the guard
installed and uninstalled, and reports the median per-call time of each.

    python scripts/bench_warp.py [--calls 2000 --blocks 15]
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


def measure(calls: int = 2000, blocks: int = 15) -> list[Row]:
    cache = tempfile.mkdtemp(prefix="warp-cache-")
    rows = []
    goals = {"launch, no tape": "<= +1.5 us, ~<= 1.15x"}
    for version in ("1.5.1", "1.19.0"):
        folder = thirdparty.install(f"warp-{version}")
        env = {**os.environ, "PYTHONPATH": str(folder), "WARP_CACHE_PATH": cache}
        env.pop("AUTOGRAD_GUARD", None)
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
    args = parser.parse_args()
    print_table(
        measure(args.calls, args.blocks),
        "wp.launch of a trivial kernel, dim=10, CPU: bare vs wrapped (guard forced on)",
    )


if __name__ == "__main__":
    main()
