"""Recursion through a guarded stage: how deep it goes under torch.compile, guarded and
unguarded, and the recursion limit a nested guarded call reads (CPython 3.10 and 3.11,
where the guard gives back the level that wrapt's C-level call costs)."""

from __future__ import annotations

import sys

import pytest
import torch

import autograd_guard

RECURSIVE = """
import sys

def fn(x, n):
    if n == 0:
        return x * 1
    return fn(x, n - 1) + 1

def limits(n, seen):
    seen.append(sys.getrecursionlimit())
    if n:
        limits(n - 1, seen)
    return seen
"""

# Dynamo traces the traced remedy in the proxy's place (with its own wrapper call on
# torch 2.2+) and the original for each level, one function unguarded: 27 levels guarded
# against 80 unguarded on torch 2.13 and 2.15, from the first compile after install()
# (the remedy is chosen as soon as Dynamo looks up the proxy's inline). Less fails.
RATIO = 0.3
POLICY = {"mode": "fix", "rules": [{"target": "recursive_stage:fn", "action": "enable_grad"}]}


@pytest.fixture
def recursive(make_module):
    make_module("recursive_stage", RECURSIVE)
    import recursive_stage

    yield recursive_stage
    torch._dynamo.reset()


def compiles_at(fn, depth: int, fresh: bool = False) -> bool:
    torch._dynamo.reset()
    if fresh:  # a new proxy, whose remedy is chosen by this compile
        autograd_guard.uninstall()
        autograd_guard.install(POLICY)
        fn = sys.modules[fn.__module__].fn
    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    try:
        return float(compiled(torch.ones(2), depth)[0]) == depth + 1
    except Exception:  # Dynamo's RecursionError, raised as its own error
        return False


def deepest(fn, low: int, high: int, fresh: bool = False) -> int:
    """The greatest depth that compiles, for ``low`` that does and ``high`` that does not."""
    assert compiles_at(fn, low, fresh) and not compiles_at(fn, high, fresh)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if compiles_at(fn, middle, fresh) else (low, middle)
    return low


def test_guarded_recursion_under_compile_keeps_its_share_of_the_unguarded_depth(recursive):
    unguarded = deepest(recursive.fn, 1, 400)
    autograd_guard.install(POLICY)
    assert hasattr(recursive.fn, "__wrapped__")  # the module's global is the proxy
    guarded = deepest(recursive.fn, 1, unguarded + 1)
    assert guarded >= RATIO * unguarded, (guarded, unguarded)
    first = deepest(recursive.fn, 1, unguarded + 1, fresh=True)
    assert first >= RATIO * unguarded, (first, unguarded)


@pytest.mark.skipif(
    sys.version_info >= (3, 12) or sys.implementation.name != "cpython",
    reason="3.12 counts Python frames only: no level is given back",
)
def test_a_nested_guarded_call_reads_a_recursion_limit_one_higher_per_level(recursive):
    autograd_guard.install(
        {"mode": "fix", "rules": [{"target": "recursive_stage:limits", "action": "enable_grad"}]}
    )
    limit = sys.getrecursionlimit()
    # the outermost call gives nothing back; each call inside another one gives a level
    assert recursive.limits(3, []) == [limit, limit + 1, limit + 2, limit + 3]
    assert sys.getrecursionlimit() == limit  # taken back on the way out


@pytest.mark.skipif(sys.version_info < (3, 12), reason="see the test above")
def test_a_nested_guarded_call_reads_the_program_s_recursion_limit(recursive):
    autograd_guard.install(
        {"mode": "fix", "rules": [{"target": "recursive_stage:limits", "action": "enable_grad"}]}
    )
    limit = sys.getrecursionlimit()
    assert recursive.limits(3, []) == [limit] * 4
