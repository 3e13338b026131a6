"""grad_health's skipped steps on real CUDA optimizers, for a machine with an NVIDIA GPU.

    python scripts/gpu_grad_health.py

The CPU suite proves "a skipped step is a step not taken" with the CUDA path's stand-in
(the device flag lent to a fused optimizer, tried on the CPU). This runs it on CUDA: a
small model trains 8 steps, two of them with non-finite gradients (an all-NaN loss, one
inf in one gradient). Unguarded, the user skips them by hand (``if not finite:
zero_grad(); continue``); guarded, the guard does. Weights and every tensor of the
optimizer's state must be bit-identical, for fused, foreach and for-loop Adam, fused
AdamW, SGD with momentum (fused and foreach), and a GradScaler loop (which skips by
itself: guarded must equal unguarded and say nothing). Also printed: the host syncs of a
healthy step (torch's sync debug mode), bare and guarded. Exits 1 if any check fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

CHILD = """
import json, os, warnings, torch
import autograd_guard
from autograd_guard.testing import capture_events
GUARDED = os.environ["GUARDED"] == "1"
if GUARDED:
    autograd_guard.install()
F = torch.nn.functional
OPTIMIZERS = {
    "adam_fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "adam_foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    "adam_forloop": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
    "sgd_fused": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, fused=True),
    "sgd_foreach": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, foreach=True),
    "adam_gradscaler": lambda p: torch.optim.Adam(p, lr=1e-2),
}

def finite(model):
    return all(bool(p.grad.isfinite().all()) for p in model.parameters() if p.grad is not None)

def train(name, steps=8, bad=(2, 5)):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 1)).cuda()
    opt = OPTIMIZERS[name](model.parameters())
    scaler = torch.amp.GradScaler("cuda") if name == "adam_gradscaler" else None
    x, y = torch.randn(32, 8, device="cuda"), torch.randn(32, 1, device="cuda")
    for step in range(steps):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16, enabled=scaler is not None):
            loss = F.mse_loss(model(x).float(), y)
        if step == bad[0]:
            loss = loss * float("nan")
        (scaler.scale(loss) if scaler else loss).backward()
        if step == bad[1]:
            model[0].weight.grad[0, 0] = float("inf")
        if scaler is not None:
            scaler.step(opt); scaler.update(); continue
        if not GUARDED and not finite(model):
            opt.zero_grad(); continue
        opt.step()
    state = {f"{i}.{k}": v for i, s in enumerate(opt.state.values()) for k, v in s.items()
             if isinstance(v, torch.Tensor)}
    return [p.detach().cpu() for p in model.parameters()], {k: v.cpu() for k, v in state.items()}

def syncs(name, steps=5):
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256).cuda()
    opt = OPTIMIZERS[name](model.parameters())
    x = torch.randn(64, 256, device="cuda")
    for step in range(steps + 20):
        if step == 20:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("warn")
            caught = warnings.catch_warnings(record=True); log = caught.__enter__()
            warnings.simplefilter("always")
        opt.zero_grad(); model(x).square().mean().backward(); opt.step()
    torch.cuda.set_sync_debug_mode("default"); caught.__exit__(None, None, None)
    return sum("synchroniz" in str(w.message) for w in log) / steps

out = {}
for name in OPTIMIZERS:
    with capture_events() as events:
        params, state = train(name)
    torch.save((params, state), os.environ["RESULT"] + f".{name}.pt")
    out[name] = {"events": [e["action"] for e in events],
                 "syncs_per_step": None if name == "adam_gradscaler" else syncs(name)}
print("RESULT:" + json.dumps(out))
"""


def child(guarded: bool, result: str) -> dict[str, dict[str, object]]:
    return run_child(CHILD, {"GUARDED": "1" if guarded else "0", "RESULT": result})


def run_child(code: str, env: dict[str, str]) -> dict[str, Any]:
    """``code`` run in a child interpreter with ``env`` added (the guard not started by
    the variable): what its ``RESULT:`` line says. Exits 1 with its output if it failed."""
    env = dict(os.environ, **env)
    env.pop("AUTOGRAD_GUARD", None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT:")]
    if done.returncode or not lines:
        print(done.stdout[-3000:], done.stderr[-3000:])
        sys.exit(1)
    return dict(json.loads(lines[-1][len("RESULT:") :]))


def same(a: object, b: object) -> bool:
    import torch

    (pa, sa), (pb, sb) = a, b  # type: ignore[misc]
    return (
        len(pa) == len(pb)
        and all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True))
        and sa.keys() == sb.keys()
        and all(torch.equal(sa[k], sb[k]) for k in sa)
    )


def main() -> int:
    import tempfile

    import torch

    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    failed = 0
    with tempfile.TemporaryDirectory() as folder:
        bare = child(False, f"{folder}/bare")
        guarded = child(True, f"{folder}/guarded")
        for name in bare:
            ok = same(
                torch.load(f"{folder}/bare.{name}.pt"), torch.load(f"{folder}/guarded.{name}.pt")
            )
            events = guarded[name]["events"]
            ok = ok and bool(events) == (name != "adam_gradscaler")  # the scaler skips itself
            failed += not ok
            print(
                f"{'ok  ' if ok else 'FAIL'} {name:16} weights and state bit-identical: "
                f"{ok}; guarded events {events}; host syncs per healthy step: bare "
                f"{bare[name]['syncs_per_step']}, guarded {guarded[name]['syncs_per_step']}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
