"""Issue 19 item 4: ``ProcessPoolExecutor(spawn).map(Stage.srun, ...)`` with a guarded
staticmethod: it must pickle by reference, as unguarded."""

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:Stage.srun"
        action = "enable_grad"
    """,
}


class Stage:
    @staticmethod
    def srun(x):
        return x + 1


def main():
    print(pickle.loads(pickle.dumps(Stage.srun))(torch.ones(1)).item())
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        print([t.item() for t in pool.map(Stage.srun, [torch.ones(1), torch.zeros(1)])])
