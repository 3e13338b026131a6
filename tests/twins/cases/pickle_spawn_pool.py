"""A guarded stage handed to a spawn ProcessPoolExecutor, pickled, deep-copied and saved
inside a module: it pickles by reference and runs in the workers, as unguarded."""

import copy
import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:smooth"
        action = "enable_grad"
        [[rules]]
        target = "case:Holder.step"
        action = "snapshot"
    """,
}


def smooth(x):
    return x * 2 + torch.is_grad_enabled()


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fn = smooth

    def step(self, x):
        return self.fn(x)


def main():
    print(pickle.loads(pickle.dumps(smooth)) is smooth, copy.deepcopy(smooth) is smooth)
    holder = Holder()
    clone = pickle.loads(pickle.dumps(holder.step))
    print(clone(torch.ones(2)).tolist(), copy.deepcopy(holder).step(torch.ones(1)).item())
    torch.save(holder, "holder.pt")
    print(torch.load("holder.pt", weights_only=False).fn is smooth)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        print([t.tolist() for t in pool.map(smooth, [torch.ones(2), torch.zeros(1)])])
