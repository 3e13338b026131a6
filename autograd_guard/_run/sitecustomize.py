"""Put on PYTHONPATH by ``autograd-guard run``: starts the guard where ``.pth`` files are not
processed, then hands over to any other ``sitecustomize`` further down ``sys.path``."""

from __future__ import annotations

import os
import sys


def _start_then_chain() -> None:
    from autograd_guard import _boot
    from autograd_guard._common import environment as _environment

    if _environment.requested():
        _boot.bootstrap(now=True)
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    from importlib.machinery import PathFinder
    from importlib.util import module_from_spec

    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_start_then_chain()
