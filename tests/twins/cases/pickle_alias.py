"""Issue 19 item 4: a guarded function exported under another name (``fit = _fit_impl``)
pickles by reference through either name, as unguarded."""

import pickle

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:_fit_impl"
        action = "enable_grad"
    """,
}


def _fit_impl(x):
    return x - 1


fit = _fit_impl


def main():
    print(pickle.loads(pickle.dumps(fit))(torch.ones(1)).item())
    print(pickle.loads(pickle.dumps(_fit_impl)) is _fit_impl)
