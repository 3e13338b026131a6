"""Issue 19 item 4: a guarded method reached through its class (``Fitter.run``), pickled
and called with an instance: by reference, as unguarded."""

import pickle

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:Fitter.run"
        action = "enable_grad"
    """,
}


class Fitter:
    def run(self, x):
        return x * 3


def main():
    function = pickle.loads(pickle.dumps(Fitter.run))
    print(function(Fitter(), torch.ones(1)).item())
    print(pickle.loads(pickle.dumps([Fitter.run, Fitter().run]))[1](torch.ones(1)).item())
