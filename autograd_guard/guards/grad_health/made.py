"""Where a non-finite value was made, read from one backward graph: a backward node's key
(what repair recognises it by in later passes), the forward op that first made a
non-finite value that the forward pass already held, and a gradient with its non-finite
values made 0.

A forward op's output is kept in its own node only where its backward needs it
(``softmax``, ``exp``: ``_saved_result``); otherwise it is seen as a saved input of the
node that consumed it (``log(0) * 0``: the multiplication saved ``-inf``). So the op that
made a value is the deepest node holding a non-finite saved value: itself, where that is
its result; where it is an input, the first node below it along that input (views and
selections save nothing) whose own saved values were finite. A leaf there means the value
came in with the weights or the inputs.
"""

from __future__ import annotations

import re
import sys

from autograd_guard.guards.grad_health.dist import local_gradient
from autograd_guard.guards.grad_health.recompute import recompute, recomputes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_INPUTS = {"_saved_self": 0, "_saved_other": 1}  # a saved input, and its place in next_functions
_BACKWARD = re.compile(r"Backward\d*$")
# where a CamelCase word begins: after a lower-case letter, or an upper-case letter that
# ends an acronym ("MaxPool2DWithIndices" -> max_pool2d_with_indices, "Im2Col" -> im2col)
_WORDS = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
LEAF = "a leaf (weights or inputs)"


def in_transform() -> bool:
    """A ``torch.func`` transform (vmap, grad, jacrev) runs this pass: its tensors are
    wrapped per level and cannot be read outside it, so the probe and the repair step aside."""
    functorch = getattr(sys.modules["torch"]._C, "_functorch", None)
    peek = getattr(functorch, "peek_interpreter_stack", None)
    try:
        return peek is not None and peek() is not None
    except Exception:
        return True


def pass_roots(torch: Any, roots: Any) -> tuple[list[Any], list[Any]]:
    """What a backward pass starts from: the root tensors (whose values the loss check
    reads) and the graph's nodes at the roots. A root may be a ``GradientEdge`` (torch
    2.4+; ``torch.distributed.pipelining``'s stage backward passes them): its node, and no
    value."""
    kinds = (torch.Tensor, getattr(torch.autograd.graph, "GradientEdge", torch.Tensor))
    roots = [roots] if isinstance(roots, kinds) else list(roots)
    values = [root for root in roots if isinstance(root, torch.Tensor)]
    edges = [getattr(root, "node", None) for root in roots if not isinstance(root, torch.Tensor)]
    return values, [value.grad_fn for value in values] + edges


def graph_nodes(roots: list[Any]) -> list[Any]:
    """Every node of the backward graph below ``roots``, each once."""
    seen: set[int] = set()
    nodes, todo = [], list(roots)
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return nodes


AUTOGRAD = ("backward", "grad")  # the functions a pass goes through, patched while in use


def patch_autograd(
    wrap: Callable[[str], Any], originals: dict[str, Any], patched: dict[str, Any]
) -> None:
    """``torch.autograd.backward`` and ``grad`` replaced by ``wrap(name)``; what was there
    kept in ``originals``, what was put there in ``patched``."""
    autograd = sys.modules["torch"].autograd
    for name in AUTOGRAD:
        originals[name] = getattr(autograd, name)
        patched[name] = wrap(name)
        setattr(autograd, name, patched[name])


def unpatch_autograd(originals: dict[str, Any], patched: dict[str, Any]) -> None:
    """What ``patch_autograd`` replaced, put back only where its own is still there."""
    autograd = sys.modules["torch"].autograd
    for name, original in originals.items():
        if getattr(autograd, name) is patched[name]:
            setattr(autograd, name, original)


def node_key(node: Any) -> tuple[Any, ...]:
    """What a backward node is recognised by in later passes of the same code: its kind
    and the kinds of the nodes its gradients go to (the same call site makes the same)."""
    below = tuple(type(n).__name__ for n, _ in node.next_functions)
    return (type(node).__name__, below)


def forward_name(op: str) -> str:
    """``SoftmaxBackward0`` -> ``softmax``, ``MaskedFillBackward0`` -> ``masked_fill``; a
    compiled graph's node as it is named."""
    name = _BACKWARD.sub("", op)
    return _WORDS.sub("_", name).lower() if name != op and name else op


# Nodes whose output, where a forward value they saved is non-finite and the loss drops it,
# is mended exactly by making that output 0: each output value depends on the matching
# values of the forward (element by element; softmax row by row, and a NaN row is NaN
# whole). A node that sums over them (a matrix product, a broadcast) mixes a NaN times 0
# into finite values: matrix products, LayerNorm and broadcasting products are recomputed
# with those saved values as 0 (``recompute``); other such nodes are not repaired.
LOCAL = frozenset(
    f"{name}Backward{n}"
    for name in (
        "Mul", "Div", "Pow", "Sub", "Add", "Rsub", "Exp", "Log", "Log1p", "Sqrt", "Rsqrt",
        "Sin", "Cos", "Tan", "Tanh", "Sigmoid", "Neg", "Abs", "Where", "MaskedFill", "Clamp",
        "ClampMin", "ClampMax", "Softmax", "LogSoftmax", "Reciprocal", "Atan2", "Asin",
        "Acos", "Atan", "Sinh", "Cosh", "Erf", "Expm1", "Xlogy", "Hypot",
    )
    for n in (0, 1)
)  # fmt: skip
# Spectral decompositions: at repeated eigen- or singular values their backward divides by
# the values' differences, and 0 is not the gradient's limit there (a matrix square root's
# true gradient solves a Sylvester equation): never mended, wherever the values came from.
SPECTRAL = frozenset(
    (
        "LinalgEighBackward0",
        "LinalgEigBackward0",
        "LinalgSvdBackward0",
        "SvdBackward0",
        "SvdHelperBackward",
        "SymeigBackward0",
        "EigBackward0",
    )
)
SPECTRAL_REMEDY = (
    "give the decomposition a backward that holds at repeated values (a matrix square "
    "root: solve the Sylvester equation, or use a Newton-Schulz iteration), or keep the "
    "values apart (a small jitter on the diagonal, noise in the points)"
)


def declined_words(op: str) -> str:
    """Why repair does not begin at ``op`` (a node the localiser found, not mendable)."""
    if op in SPECTRAL:
        return (
            f"{op} is not repaired: at repeated eigenvalues or singular values its backward "
            "divides by their differences, and 0 is not the gradient's limit there (fix "
            "skips such steps)"
        )
    return (
        f"{op} is not repaired: its forward value was already non-finite and it sums over "
        "it, so setting its output to 0 is not the limit (fix skips such steps)"
    )


def mendable(node: Any, tainted: bool, grad_inputs: Any, grad_outputs: Any) -> bool:
    """Whether making ``node``'s non-finite outputs 0 (recomputing, for the nodes that sum
    over a forward value: ``recompute``) gives the gradient's limit: always where its
    forward values were finite (a singular point of the op); where they were not, for the
    nodes recomputed, and for the element-wise nodes above with shapes unchanged."""
    name = type(node).__name__
    if not tainted or recomputes(node, grad_inputs):
        return True
    shape = getattr(grad_outputs[0], "shape", None) if grad_outputs else None
    same = all(g is None or g.shape == shape for g in grad_inputs)
    return name in LOCAL and same


def mend_node(torch: Any, node: Any, grad_inputs: Any, grad_outputs: Any, gate: Any) -> Any:
    """``node``'s outputs mended (a tuple), and the flags of what changed (on the device)."""
    grad = grad_outputs[0] if grad_outputs else None
    found, recomputed = recompute(torch, node, grad_inputs, grad, gate)
    out, flags = [], [] if recomputed is None else [recomputed]
    for value in found:
        value, changed = mended(torch, value, gate)
        out.append(value)
        if changed is not None:
            flags.append(changed)
    return tuple(out), flags


def sanitised(torch: Any, grad: Any, gate: Any) -> Any:
    """``grad`` with its non-finite values made 0 where ``gate`` (a flag on the device:
    the loss is finite) allows it; the same tensor where it holds no floating values. No
    host read."""
    return mended(torch, grad, gate)[0]


def mended(torch: Any, grad: Any, gate: Any) -> tuple[Any, Any]:
    """``sanitised``, and a flag on the device: whether a value was changed (None where
    none could be)."""
    if grad is None or not grad.is_floating_point():
        return grad, None
    if grad.layout != torch.strided:  # a sparse gradient's stored values (nn.Embedding)
        if not grad.is_sparse:
            return grad, None
        values, changed = mended(torch, grad._values(), gate)
        made = torch.sparse_coo_tensor(grad._indices(), values, grad.shape, check_invariants=False)
        return made, changed
    bad = ~torch.isfinite(grad)
    if gate is not None:
        bad = bad & gate
    return grad.masked_fill(bad, 0), bad.any()


def forward_maker(first: Any, saved: Callable[[Any], dict[str, bool]]) -> tuple[str, Any] | None:
    """(the forward op's name, its backward node) that made the non-finite value that
    ``first`` (a node whose saved forward values are not finite) saw; (``LEAF``, node)
    where the value came in with a leaf; None where this cannot be told. ``saved``: a
    node's saved values by name, finite or not, as recorded while the pass ran."""
    node = _deepest(first, saved)
    names = saved(node)
    if names.get("_saved_result") is False or names.get("_saved_output") is False:
        return forward_name(type(node).__name__), node
    index = next((i for name, i in _INPUTS.items() if names.get(name) is False), None)
    if index is None or index >= len(node.next_functions):
        return None
    below = node.next_functions[index][0]
    while below is not None and not saved(below) and below.next_functions:
        below = below.next_functions[0][0]
    if below is None or not below.next_functions:  # AccumulateGrad, or an input
        return LEAF, node
    return forward_name(type(below).__name__), below


def leaves_finite(torch: Any, node: Any) -> bool:
    """The parameters (leaves) below ``node`` hold finite values (read once, after a pass)."""
    seen: set[int] = set()
    todo, leaves = [node], []
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        variable = getattr(current, "variable", None)
        if variable is not None and variable.is_floating_point():
            leaves.append(local_gradient(variable.detach()))  # a DTensor: this rank's shard
        todo.extend(n for n, _ in current.next_functions)
    # a storage freed after backward (FSDP2's unsharded parameters) cannot be read
    return all(bool(v.isfinite().all()) for v in leaves if v.untyped_storage().nbytes())


def leaves_below(nodes: list[Any]) -> list[Any]:
    """The parameters (leaves) whose gradients pass through ``nodes``."""
    return [
        node.variable
        for node in graph_nodes([n for root in nodes for n, _ in root.next_functions])
        if getattr(node, "variable", None) is not None
    ]


def _deepest(first: Any, saved: Callable[[Any], dict[str, bool]]) -> Any:
    """The node nearest the leaves, below ``first``, that still holds a non-finite saved
    value (the value was made at or below it)."""
    node, seen = first, 0
    while seen < 10_000:
        deeper = next(
            (
                n
                for n, _ in node.next_functions
                if n is not None and not all(_below_saved(n, saved).values())
            ),
            None,
        )
        if deeper is None:
            return node
        node, seen = deeper, seen + 1
    return node


def _below_saved(node: Any, saved: Callable[[Any], dict[str, bool]]) -> dict[str, bool]:
    """``node``'s saved values, or, for a node that saves none (a view), those of the first
    node below it that does."""
    depth = 0
    while node is not None and depth < 64:
        found = saved(node)
        if found or not node.next_functions:
            return found
        node, depth = node.next_functions[0][0], depth + 1
    return {}
