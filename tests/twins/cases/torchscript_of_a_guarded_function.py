"""``torch.jit.script`` of a guarded stage compiles the original's source; one event says
the guard cannot run in scripted code, and the results are the same."""

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:blend"
        action = "enable_grad"
    """,
    "modes": {
        "fix": {"events": ["grad_mode/scripted_unguarded"]},
        "strict": {"events": ["grad_mode/scripted_unguarded"]},
    },
}


def blend(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * 0.25 + b * 0.75


def main():
    scripted = torch.jit.script(blend)
    print(scripted(torch.ones(3), torch.zeros(3)).tolist(), blend(torch.ones(1), torch.ones(1)))
