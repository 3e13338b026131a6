"""Issue 19 item 8: a policy nested too deeply for the TOML parser (RecursionError) is an
invalid policy: under ``AUTOGRAD_GUARD=strict`` a program that imports torch stops there
with one line, instead of running unguarded; in fix it runs unguarded with one error."""

TWIN = {
    "policy": "mode = 'fix'\nx = " + "[" * 3000 + "]" * 3000 + "\n",
    "modes": {
        "fix": {"events": ["autograd_guard/disabled"]},
        "strict": {"raises": "builtins.SystemExit", "stderr": "invalid policy in strict mode"},
    },
}


def main():
    import torch

    print(torch.ones(2).sum().item())
