"""Compiled code that calls a guarded ``staticmethod`` and ``classmethod`` stage under
no_grad, three times: each stage gets grad (as under ``torch.enable_grad()``), in the
graph or at a graph break, and nothing is recompiled on later calls."""

import os

TWIN = {
    "policy": """
        [[rules]]
        target = "case:Stage.solve"
        action = "enable_grad"

        [[rules]]
        target = "case:Stage.score"
        action = "enable_grad"
    """,
    "modes": {
        "fix": {
            "events": ["grad_mode/enable_grad"],
            # torch 2.6's Dynamo puts one of the two calls at the graph break on the def line
            "maybe": ["grad_mode/enable_grad"],
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
    return Stage.solve(x, w), Stage.score(x, w)


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
