"""Issue 19 item 8: a policy nested too deeply for the TOML parser (RecursionError) is an
invalid policy: in fix it runs unguarded with one headline and one line per problem on
stderr, and one error event. Under ``AUTOGRAD_GUARD=strict`` the process stops before the
program runs (exit status 2), which a twin cannot compare: tests/test_autoload.py runs it."""

TWIN = {
    "policy": "mode = 'fix'\nx = " + "[" * 3000 + "]" * 3000 + "\n",
    "modes": {
        "fix": {"events": ["autograd_guard/disabled"], "stderr": "invalid policy; running"},
    },
}


def main():
    import torch

    print(torch.ones(2).sum().item())
