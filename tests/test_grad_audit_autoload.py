"""grad_audit as users get it: the built wheel's ``.pth`` in a fresh venv, child
interpreters with ``AUTOGRAD_GUARD`` set (it hooks ``Function.apply`` at ``import torch``),
unset (nothing), and a correct program (silent)."""

from __future__ import annotations

import pytest
import torch
from helpers import run_python
from packaging.version import Version

# torch 2.1's Dynamo breaks the graph at a hooked Function: grad_audit stands down below 2.2.
pytestmark = pytest.mark.skipif(
    Version(torch.__version__.split("+")[0]) < Version("2.2"),
    reason="grad_audit stands down on torch < 2.2",
)

PROGRAM = """
import torch
from torch.utils.checkpoint import checkpoint


class WrongSign(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return SIGN * g * x.cos()

lin = torch.nn.Linear(3, 3)
x = torch.randn(4, 3, requires_grad=True)
try:
    out = checkpoint(lambda v: RETURNS, x, use_reentrant=True)
    (out[0].sum() + WrongSign.apply(x).sum()).backward()
    print("ran", x.grad.shape)
except Exception as exc:
    print("raised", type(exc).__name__)
"""


def program(correct: bool) -> str:
    sign, returns = ("", "(lin(v),)") if correct else ("-", "[lin(v)]")
    return PROGRAM.replace("SIGN * ", f"{sign}1 * ").replace("RETURNS", returns)


def line_of(text: str) -> int:
    return next(i for i, line in enumerate(program(False).splitlines(), 1) if text in line)


def test_both_bugs_named_at_their_lines_through_the_pth(guard_python, project):
    unguarded = run_python(guard_python, program(False), project)
    assert "grad_audit" not in unguarded.stderr and unguarded.stdout.startswith("ran")
    guarded = run_python(guard_python, program(False), project, AUTOGRAD_GUARD="1")
    assert guarded.stdout == unguarded.stdout  # never changed: the same run
    cut = "[grad_audit/cut_gradient] torch.utils.checkpoint.CheckpointFunction"
    assert cut in guarded.stderr and f"<string>:{line_of('out = checkpoint(')}" in guarded.stderr
    assert "[grad_audit/wrong_gradient] __main__.WrongSign's backward" in guarded.stderr
    assert f"<string>:{line_of('WrongSign.apply(x)')}" in guarded.stderr


@pytest.mark.parametrize("mode", ["1", "strict"])
def test_a_correct_program_is_silent_through_the_pth(guard_python, project, mode):
    unguarded = run_python(guard_python, program(True), project)
    guarded = run_python(guard_python, program(True), project, AUTOGRAD_GUARD=mode)
    assert guarded.stdout == unguarded.stdout and guarded.stdout.startswith("ran")
    assert "grad_audit" not in guarded.stderr


def test_strict_raises_at_the_first_call_through_the_pth(guard_python, project):
    guarded = run_python(guard_python, program(False), project, AUTOGRAD_GUARD="strict")
    assert guarded.stdout.strip() == "raised GuardError"
    assert "[grad_audit/cut_gradient]" in guarded.stderr
