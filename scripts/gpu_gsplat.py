"""gsplat_means2d on real CUDA gsplat, for a machine with an NVIDIA GPU.

    python scripts/gpu_gsplat.py [GSPLAT_FOLDER]

Renders a few hundred Gaussians with gsplat's real CUDA kernels (packed and unpacked,
with and without absgrad), backpropagates, and checks ``meta["means2d"].grad``: None
unguarded, filled guarded (and equal to the grad from the user's own retain_grad()).
Each case runs in a child interpreter; exits 1 if any check fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from thirdparty import first_on_path

CHILD = """
import json, os, torch
import autograd_guard
if os.environ["GUARDED"] == "1":
    autograd_guard.install()
import gsplat
torch.manual_seed(0)
n, device = 300, "cuda"
means = (torch.randn(n, 3, device=device) * 0.5 + torch.tensor([0, 0, 3.0], device=device))
params = dict(means=means.requires_grad_(), quats=torch.randn(n, 4, device=device),
              scales=torch.rand(n, 3, device=device) * 0.05 + 0.02,
              opacities=torch.rand(n, device=device), colors=torch.rand(n, 3, device=device))
viewmats = torch.eye(4, device=device)[None]
Ks = torch.tensor([[[300.0, 0, 128], [0, 300.0, 128], [0, 0, 1]]], device=device)
out = {}
for packed in (False, True):
    for absgrad in (False, True):
        for own_retain in (False, True):
            image, _, meta = gsplat.rasterization(**params, viewmats=viewmats, Ks=Ks, width=256,
                                                  height=256, packed=packed, absgrad=absgrad)
            if own_retain:
                meta["means2d"].retain_grad()
            image.sum().backward()
            m = meta["means2d"]
            grad = m.grad
            out[f"packed={packed} absgrad={absgrad} own_retain={own_retain}"] = {
                "grad": None if grad is None else float(grad.abs().sum()),
                "absgrad": None if getattr(m, "absgrad", None) is None
                           else float(m.absgrad.sum()),
            }
print(json.dumps({"version": gsplat.__version__, "results": out}))
"""


def main() -> int:
    env = dict(os.environ)
    if len(sys.argv) > 1:
        env["PYTHONPATH"] = first_on_path(sys.argv[1])
    results = {}
    for guarded in ("0", "1"):
        child = subprocess.run(
            [sys.executable, "-c", CHILD],
            env={**env, "GUARDED": guarded},
            capture_output=True,
            text=True,
        )
        if child.returncode:
            print(child.stderr[-3000:])
            return 1
        results[guarded] = json.loads(child.stdout.strip().splitlines()[-1])
    failures = 0
    print(f"gsplat {results['0']['version']} on CUDA")
    for case, unguarded in results["0"]["results"].items():
        guarded = results["1"]["results"][case]
        own = "own_retain=True" in case
        ok = (unguarded["grad"] is not None) == own and guarded["grad"] is not None
        if own:
            ok = ok and abs(guarded["grad"] - unguarded["grad"]) <= 1e-4 * abs(unguarded["grad"])
        if "absgrad=True" in case:
            ok = ok and guarded["absgrad"] is not None
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {case:<45} unguarded={unguarded} guarded={guarded}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
