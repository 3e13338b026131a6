"""The policy lives in ``[tool.autograd_guard]`` of the project's pyproject.toml: the rule
applies, as it does from autograd_guard.toml."""

import os

import torch

TWIN = {
    "files": {
        "pyproject.toml": """
            [project]
            name = "demo"
            version = "0"

            [tool.autograd_guard]
            extends = "default"

            [[tool.autograd_guard.rules]]
            target = "case:fit"
            action = "enable_grad"
        """,
    },
    "modes": {"fix": {"events": ["grad_mode/enable_grad"], "like": "handfix"}},
}


def fit(x):
    x = x.clone().requires_grad_()
    x.pow(3).sum().backward()
    return x.grad


def main():
    with torch.no_grad():
        if os.environ.get("TWIN_HANDFIX"):
            with torch.enable_grad():
                print(fit(torch.arange(3.0)).tolist())
        else:
            print(fit(torch.arange(3.0)).tolist())
