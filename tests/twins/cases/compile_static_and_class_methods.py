"""Compiled code that calls a guarded ``staticmethod`` stage and a classmethod of the
same class under no_grad, three times: the stage gets grad (as under
``torch.enable_grad()``), in the graph or at a graph break, and nothing is recompiled on
later calls. (A guarded classmethod in compiled code: tests/test_compile_regions.py, as
torch 2.15 traces it unguarded.)"""

import os

TWIN = {
    "policy": """
        [[rules]]
        target = "case:Stage.solve"
        action = "enable_grad"
    """,
    "modes": {
        "fix": {
            "events": ["grad_mode/enable_grad"],
            "like": "handfix",
        }
    },
}


class Stage:
    scale = 2.0

    @staticmethod
    def solve(x, w):
        return (x * w).sum()

    @classmethod
    def score(cls, x, w):
        return (x * w * cls.scale).sum()


def step(x, w):
    return Stage.solve(x, w), Stage.score(x.detach(), w.detach())


def main():
    import torch._dynamo.utils

    w = torch.ones(3, requires_grad=True)
    compiled = torch.compile(step, backend="eager")
    results = []
    for i in range(3):
        with torch.no_grad():
            if os.environ.get("TWIN_HANDFIX"):
                with torch.enable_grad():
                    results.append(compiled(torch.arange(3.0) + i, w))
            else:
                results.append(compiled(torch.arange(3.0) + i, w))
    print("requires grad:", [r.requires_grad for pair in results for r in pair])
    sum(r for pair in results for r in pair).backward()
    print(w.grad.tolist(), [r.item() for pair in results for r in pair])
    print("recompiles:", torch._dynamo.utils.counters["stats"]["unique_graphs"] > 4)
