"""A guarded stage run in a forked child process and in a subprocess of the program: the
children inherit the guard, and correct code behaves and logs as unguarded (nothing)."""

import multiprocessing
import subprocess
import sys

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:fit"
        action = "enable_grad"
    """,
}


def fit(x):
    x = x.clone().requires_grad_()
    (x * 3).sum().backward()
    return x.grad


def child(queue):
    queue.put(fit(torch.ones(2)).tolist())


def main():
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=child, args=(queue,))
    process.start()
    print("fork", queue.get(timeout=120))
    process.join()
    code = "import torch, case; print(case.fit(torch.ones(1)).tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    print("subprocess", out.stdout.strip(), out.returncode)
