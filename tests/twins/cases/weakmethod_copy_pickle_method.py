"""A guarded method through ``weakref.WeakMethod``, ``inspect``, ``copy``, ``pickle`` and a
``functools.partial``, eagerly and in ``torch.compile``: everything a program asks of a
bound method answers as unguarded."""

import copy
import functools
import inspect
import pickle
import types
import weakref

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:Model.score"
        action = "enable_grad"
    """,
}


class Model:
    def __init__(self, scale):
        self.scale = scale

    def score(self, x, offset=0.0):
        """Scaled sum."""
        return (x * self.scale).sum() + offset


def compiled_score(method):
    """The bound method held by a compiled function (a closure)."""
    scored = torch.compile(lambda x: method(x, offset=0.5), backend="eager", fullgraph=True)
    return scored(torch.ones(2)).item()


def main():
    model = Model(2.0)
    method = model.score
    weak = weakref.WeakMethod(method)
    print(type(method) is types.MethodType, inspect.ismethod(method), callable(method))
    print(inspect.signature(method), method.__name__, method.__doc__, method.__qualname__)
    print(method.__self__ is model, method == model.score, weak() == method)
    print(weak()(torch.ones(3)).item(), functools.partial(method, offset=1.0)(torch.ones(3)).item())
    copied = copy.deepcopy(method)
    print(copied.__self__ is model, copied.__self__.scale, copied(torch.ones(2)).item())
    loaded = pickle.loads(pickle.dumps(method))
    print(type(loaded).__name__, loaded.__self__.scale, loaded(torch.ones(2)).item())
    try:  # torch.compile does not trace a WeakMethod's call: the same error as unguarded
        torch.compile(lambda x: weak()(x), backend="eager", fullgraph=True)(torch.ones(2))
    except Exception as exc:
        print(type(exc).__name__)
    print(compiled_score(method))
    del model, method, copied
    print(weak())  # the method's instance is gone: nothing kept it alive
