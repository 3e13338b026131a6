"""Which parameters of a Warp kernel read the arrays passed to them, and which write them,
from the kernel's own source: its syntax tree, ``kernel.adj.tree``, and its parameters,
``kernel.adj.args`` (both in Warp 1.0 to 1.19).

Warp's code generation marks each parameter ``is_read``/``is_write`` too, but only while
``verify_autograd_array_access`` is set, and only in a build: a kernel loaded from Warp's
kernel cache has every mark False. So the guard reads the tree itself, erring towards
"reads and writes": a kernel Warp accepts may then cost a needless copy (compared at
``backward()``, never a finding by itself), never a missed write.

- ``a[i] = v`` writes ``a``; ``a[i] += v`` and ``a[i] -= v`` (atomic in Warp) and
  ``wp.atomic_add(a, ...)``, ``wp.atomic_sub``, ``wp.array_store``, ``wp.tile_store``,
  ``wp.tile_atomic_add`` write it without reading it (their adjoints do not read ``a``);
- ``a[i, j]`` with one index per dimension, ``a.shape``, ``len(a)``, ``wp.tile_load(a,
  ...)`` and ``wp.lower_bound(a, ...)`` read it;
- anything else (a view ``a[i]`` of a 2-D array, ``b = a``, ``f(a)`` for a ``wp.func``
  or another builtin, another augmented assignment) reads and writes it.

A kernel whose tree cannot be read has every array parameter read and written, and so has
a generic parameter (``typing.Any``), which may be an array.
"""

from __future__ import annotations

import ast
import typing

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    Access = tuple[tuple[int, ...], tuple[int, ...]]  # (positions read, positions written)

STORES = frozenset({"atomic_add", "atomic_sub", "array_store", "tile_store", "tile_atomic_add"})
READ_ONLY = frozenset({"len", "tile_load", "lower_bound"})
READ, WRITE, BOTH = 1, 2, 3
ANY = 64  # a generic parameter's dimensions: no subscript reaches an element


def of(kernel: Any) -> Access:
    """``kernel``'s parameters, by position, that may read and that may write an array."""
    params = kernel.adj.args
    arrays: dict[str, tuple[int, int]] = {
        p.label: (i, ANY if p.type is typing.Any else p.type.ndim)
        for i, p in enumerate(params)  # array types have ndim; a generic one may be one
        if p.type is typing.Any or isinstance(getattr(p.type, "ndim", None), int)
    }
    try:
        uses = _uses(kernel.adj.tree.body[0], {k: v[1] for k, v in arrays.items()})
    except Exception:  # not a tree this reads: every array is read and written
        uses = dict.fromkeys(arrays, BOTH)
    reads = tuple(sorted(arrays[k][0] for k, use in uses.items() if use & READ))
    writes = tuple(sorted(arrays[k][0] for k, use in uses.items() if use & WRITE))
    return reads, writes


def _uses(function: ast.FunctionDef, ndims: dict[str, int]) -> dict[str, int]:
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(function):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    uses = dict.fromkeys(ndims, 0)
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and node.id in ndims:
            uses[node.id] |= _use(node, ndims[node.id], parents)
    return uses


def _use(name: ast.Name, ndim: int, parents: dict[int, ast.AST]) -> int:
    """How one mention of an array parameter uses it."""
    node: ast.AST = name
    indices, attribute = 0, False
    parent = parents.get(id(node))
    # climb a[i], a[i][j], a[i].x, a.shape: the outermost of them is what is used
    while isinstance(parent, (ast.Subscript, ast.Attribute)) and parent.value is node:
        if isinstance(parent, ast.Attribute):
            attribute = True
        elif not attribute:
            index = parent.slice
            index = getattr(index, "value", index)  # ast.Index up to Python 3.8
            if isinstance(index, ast.Slice) or (
                isinstance(index, ast.Tuple) and any(isinstance(e, ast.Slice) for e in index.elts)
            ):
                return BOTH  # a view
            indices += len(index.elts) if isinstance(index, ast.Tuple) else 1
        node, parent = parent, parents.get(id(parent))
    element = indices >= ndim or (attribute and indices == 0)  # a value, or a.shape
    if isinstance(getattr(node, "ctx", None), (ast.Store, ast.Del)):
        if isinstance(parent, ast.AugAssign) and parent.target is node:
            return WRITE if element and isinstance(parent.op, (ast.Add, ast.Sub)) else BOTH
        return WRITE if element and not attribute and isinstance(parent, ast.Assign) else BOTH
    if element:
        return READ if indices else 0  # a.shape reads no contents
    if isinstance(parent, ast.Call) and node in parent.args:
        func = parent.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called in STORES and parent.args[0] is node:
            return WRITE
        if called in READ_ONLY:
            return READ
    return BOTH
