"""Recursion through a guarded stage: how deep it goes under torch.compile, guarded and
unguarded, and the recursion limit a nested guarded call reads (CPython 3.10 and 3.11,
where the guard gives back the level that wrapt's C-level call costs)."""

from __future__ import annotations

import json
import os
import subprocess
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

# Dynamo inlines the guard's inline function, the traced remedy and the original for each
# level (and its own wrapper call on torch 2.2+), one function unguarded: 20 levels guarded
# against 77-80 unguarded on torch 2.13 and 2.15, 42 of 85 on torch 2.1. Less fails.
RATIO = 0.2
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


LIMITS_CHILD = """
import json, sys
import autograd_guard

autograd_guard.install(
    {"mode": "fix", "rules": [{"target": "recursive_stage:limits", "action": "enable_grad"}]}
)
import recursive_stage

limit = sys.getrecursionlimit()
print(json.dumps([limit, recursive_stage.limits(3, []), sys.getrecursionlimit()]))
"""


def limits_read_in_a_child(tmp_path):
    """The limits a nested guarded call reads, in a child with no other thread (levels are
    given back only while no other Python thread runs)."""
    (tmp_path / "recursive_stage.py").write_text(RECURSIVE)
    child = subprocess.run(
        [sys.executable, "-c", LIMITS_CHILD],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path), "AUTOGRAD_GUARD": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout.splitlines()[-1])


@pytest.mark.skipif(
    sys.version_info >= (3, 12) or sys.implementation.name != "cpython",
    reason="3.12 counts Python frames only: no level is given back",
)
def test_a_nested_guarded_call_reads_a_recursion_limit_one_higher_per_level(tmp_path):
    limit, seen, after = limits_read_in_a_child(tmp_path)
    # the outermost call gives nothing back; each call inside another one gives a level
    assert seen == [limit, limit + 1, limit + 2, limit + 3]
    assert after == limit  # taken back on the way out


@pytest.mark.skipif(sys.version_info < (3, 12), reason="see the test above")
def test_a_nested_guarded_call_reads_the_program_s_recursion_limit(tmp_path):
    limit, seen, after = limits_read_in_a_child(tmp_path)
    assert seen == [limit] * 4 and after == limit
