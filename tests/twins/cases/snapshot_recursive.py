"""Issue 19 item 12: a recursive function under a snapshot rule (an octree walk) keeps
working as deep as unguarded, less one frame per level."""

import sys

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:walk"
        action = "snapshot"
    """,
}


def walk(node, depth):
    if depth == 0:
        return node.sum()
    return walk(node * 0.5, depth - 1) + 1


def deepest():
    low, high = 1, 3 * sys.getrecursionlimit()
    while low < high:
        middle = (low + high + 1) // 2
        try:
            walk(torch.ones(1), middle)
            low = middle
        except RecursionError:
            high = middle - 1
    return low


def main():
    depth = int(0.45 * sys.getrecursionlimit())
    print(walk(torch.ones(2), depth).item())
    print("reached at least", depth, ":", deepest() >= depth)
