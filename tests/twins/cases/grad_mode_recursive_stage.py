"""Issue 19 item 12: a recursive stage (a subdivision that recurses per level) under an
enable_grad rule keeps working as deep as it does unguarded, less one frame per level."""

import sys

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:subdivide"
        action = "enable_grad"
    """,
}


def subdivide(x, depth):
    if depth == 0:
        return x
    return subdivide(x * 0.5 + 1.0, depth - 1)


def deepest():
    low, high = 1, 3 * sys.getrecursionlimit()
    while low < high:
        middle = (low + high + 1) // 2
        try:
            subdivide(torch.ones(1), middle)
            low = middle
        except RecursionError:
            high = middle - 1
    return low


def main():
    # The depth this interpreter reaches unguarded, at ~two frames per level guarded.
    depth = int(0.45 * sys.getrecursionlimit())
    print(subdivide(torch.ones(2), depth).tolist())
    print("reached at least", depth, ":", deepest() >= depth)
