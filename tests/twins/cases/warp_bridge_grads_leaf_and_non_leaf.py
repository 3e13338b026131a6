"""``bridge_grads`` on: a leaf tensor that requires grad, passed to ``wp.launch`` under a
Tape, is bridged in fix (as ``wp.from_torch(t, requires_grad=True)`` by hand) and only
named in observe, which converts nothing, so its ``.grad`` stays None as unguarded; a
non-leaf is left to Warp in every mode (which rejects it as unguarded), with no warning
about reading a non-leaf's ``.grad``."""

import os

import torch
import warp as wp

TWIN = {
    "policy": """
        [guards.warp_torch_args]
        bridge_grads = true
    """,
    "libraries": ["warp-1.5.1"],
    "modes": {
        "fix": {
            "events": ["warp_torch_args/bridge_grads", "warp_torch_args/not_bridged"],
            "like": "handfix",
        },
        "observe": {"events": ["warp_torch_args/bridge_grads", "warp_torch_args/not_bridged"]},
    },
}


@wp.kernel
def square(x: wp.array(dtype=float), z: wp.array(dtype=float)):
    i = wp.tid()
    z[i] = x[i] * x[i]


def fit(x):
    wp_z = wp.from_torch(torch.zeros(4), requires_grad=True)
    tape = wp.Tape()
    try:
        with tape:
            wp.launch(square, dim=4, inputs=[x], outputs=[wp_z], device="cpu")
        tape.backward(grads={wp_z: wp.ones_like(wp_z)})
    except RuntimeError as exc:  # Warp cannot read a tensor that requires grad
        return str(exc).splitlines()[0]
    return "ok"


def main():
    wp.config.quiet = True
    wp.init()
    leaf = torch.arange(4.0, requires_grad=True)
    by_hand = os.environ.get("TWIN_HANDFIX")
    print("leaf", fit(wp.from_torch(leaf, requires_grad=True) if by_hand else leaf))
    print("leaf grad", None if leaf.grad is None else leaf.grad.tolist())
    p = torch.arange(4.0, requires_grad=True)
    print("non-leaf", fit(p * 1.0), "p grad", p.grad)
    torch.save({"leaf": leaf.grad, "p": p.grad}, "result.pt")
