"""A correct 3DGS fit with gsplat's DefaultStrategy (``step_pre_backward`` retains the
gradient): nothing changes, nothing is logged, in any mode."""

import gsplat
import torch
from gsplat_on_cpu import loss_of, scene

TWIN = {"libraries": ["gsplat"], "modes": ["fix"]}


def main():
    strategy = gsplat.DefaultStrategy(refine_start_iter=10_000, verbose=False)
    state = strategy.initialize_state()
    data = scene()
    params = torch.nn.ParameterDict(
        {
            k: torch.nn.Parameter(data[k].detach())
            for k in ("means", "quats", "scales", "opacities", "colors")
        }
    )
    optimizers = {k: torch.optim.Adam([p], lr=1e-3) for k, p in params.items()}
    for step in range(8):
        image, _, meta = gsplat.rasterization(**{**data, **params}, packed=False)
        strategy.step_pre_backward(params, optimizers, state, step, meta)
        loss_of(image).backward()
        strategy.step_post_backward(params, optimizers, state, step, meta, packed=False)
        for optimizer in optimizers.values():
            optimizer.step()
            optimizer.zero_grad()
    torch.save({"params": dict(params), "grad2d": state["grad2d"]}, "result.pt")
    print("count", state["count"].sum().item())
