"""A policy nested too deeply for the TOML parser (RecursionError) cannot be used: in fix
the shipped default preset runs instead, with one headline and one line per problem on
stderr, said again at exit, and no event. Under ``AUTOGRAD_GUARD=strict`` a program stops
at its import of torch (exit status 2), which a twin cannot compare: tests/test_autoload.py
runs it."""

TWIN = {
    "policy": "mode = 'fix'\nx = " + "[" * 3000 + "]" * 3000 + "\n",
    "modes": {
        "fix": {"events": [], "stderr": "autograd-guard: "},
    },
}


def main():
    import torch

    print(torch.ones(2).sum().item())
