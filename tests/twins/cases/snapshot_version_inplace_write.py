"""A ``version`` snapshot rule sees a torch in-place write into an input: logged, not
restored (no copy was kept); strict stops the program after the call."""

import torch

TWIN = {
    "policy": """
        [[rules]]
        target = "case:clamp_inplace"
        action = "snapshot"
    """,
    "modes": {
        "fix": {"events": ["snapshot_inputs/input_modified"]},
        "observe": {"events": ["snapshot_inputs/input_modified"]},
        "strict": {
            "events": ["snapshot_inputs/input_modified"],
            "raises": "autograd_guard.errors.GuardError",
        },
    },
}


def clamp_inplace(values, low):
    return values.clamp_(min=low)


def main():
    values = torch.tensor([-2.0, 0.5, 3.0])
    clamp_inplace(values, 0.0)
    print(values.tolist())
    torch.save(values, "result.pt")
