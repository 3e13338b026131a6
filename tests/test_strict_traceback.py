"""A strict ``GuardError``'s traceback shows the user's frames (and the library's between
them), then one frame of the guard: the wrapper or hook it was raised from, not the eight
frames of the guard's internals that made it."""

from __future__ import annotations

import os
import traceback

import pytest
import torch

import autograd_guard
from autograd_guard.errors import PACKAGE_DIR, GuardError, drop_own_frames

TORCH_DIR = os.path.dirname(torch.__file__) + os.sep

CODE = """
import torch

def stage(x):
    w = torch.zeros(1, requires_grad=True)
    ((w - x) ** 2).sum().backward()
    return w.grad

def writes(x):
    x.add_(1)
    return x

def halves(x):
    w = torch.zeros(1, requires_grad=True)
    ((w - x) ** 2).sum().backward()
    yield w.grad

def users_call(function, x):
    with torch.no_grad():
        return function(x)
"""


@pytest.fixture
def user(make_module):
    make_module("strict_user", CODE)
    autograd_guard.install(
        {
            "mode": "strict",
            "rules": [
                {"target": "strict_user:stage", "action": "enable_grad"},
                {"target": "strict_user:writes", "action": "snapshot"},
                {"target": "strict_user:halves", "action": "enable_grad"},
            ],
        }
    )
    import strict_user

    return strict_user


def frames(error: BaseException) -> list[tuple[str, str]]:
    """(where, function) of each traceback entry, as ``traceback.format_exception`` shows
    them; where is "ours" for a frame of the package."""
    assert "".join(traceback.format_exception(error)).count("GuardError") == 1
    return [
        ("ours" if f.filename.startswith(PACKAGE_DIR) else f.filename, f.name)
        for f in traceback.extract_tb(error.__traceback__)
    ]


def strict_error(function, *args) -> GuardError:
    with pytest.raises(GuardError) as caught:
        function(*args)
    return caught.value


def test_a_wrapped_stage_shows_the_users_frames_then_one_of_ours(user):
    error = strict_error(user.users_call, user.stage, torch.ones(1))
    assert frames(error) == [
        (__file__, "strict_error"),
        (user.__file__, "users_call"),
        ("ours", "autograd_guard_wrapper"),
    ]
    assert "grad_mode" in str(error) and error.__cause__ is None


def test_a_check_around_the_call_shows_one_of_ours(user):
    error = strict_error(user.writes, torch.ones(2))
    assert frames(error) == [(__file__, "strict_error"), ("ours", "autograd_guard_check_around")]
    assert "snapshot_inputs" in str(error)


@pytest.mark.parametrize("generator", [False, True], ids=["at_a_graph_break", "in_the_graph"])
def test_under_torch_compile_fullgraph_the_guards_frame_is_one(user, generator):
    if generator:  # refused while Dynamo traces: the error passes through torch._dynamo
        compiled = torch.compile(lambda x: list(user.halves(x)), backend="eager", fullgraph=True)
    else:
        compiled = torch.compile(user.stage, backend="eager", fullgraph=True)
    error = strict_error(user.users_call, compiled, torch.ones(1))
    mine = [where for where, _ in frames(error) if where == "ours"]
    assert frames(error)[:2] == [(__file__, "strict_error"), (user.__file__, "users_call")]
    assert len(mine) <= 1, frames(error)


def test_the_same_error_keeps_its_cause_and_the_frames_that_are_not_ours():
    def ours_deep():
        try:
            raise KeyError("the cause")
        except KeyError as exc:
            raise GuardError("strict") from exc

    with pytest.raises(GuardError) as caught:
        ours_deep()
    error = caught.value
    entries = list(traceback.walk_tb(error.__traceback__))
    # This test file is not the package: every frame stays, the error is the same object.
    assert drop_own_frames(error) is error and error.__traceback__ is not None
    assert [f.f_code.co_name for f, _ in traceback.walk_tb(error.__traceback__)] == [
        f.f_code.co_name for f, _ in entries
    ]
    assert isinstance(error.__cause__, KeyError)


def nan_step(closure: bool) -> None:
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        value = torch.sqrt(weight).sum()  # d sqrt(x)/dx at 0: inf
        value.backward()
        return value

    if closure:
        optimizer.step(loss)  # a closure's step is stopped at its evaluation
    else:
        for _ in range(2):  # strict skips the first and raises at the next (issue 52)
            loss()
            optimizer.step()


@pytest.mark.parametrize("closure", [False, True], ids=["step", "step_with_closure"])
def test_grad_health_raises_from_the_step_with_one_frame_of_ours(closure):
    autograd_guard.install("strict")
    error = strict_error(nan_step, closure)
    listed = frames(error)
    assert listed[:2] == [(__file__, "strict_error"), (__file__, "nan_step")]
    # torch's step wrapper runs the gate; where a compile took the hooks off a class's
    # step (torch 2.1; any torch once Dynamo's optimizer patcher ran) the guard's own
    # wrapper runs it. Only a closure's evaluation in the optimizer's step comes after.
    [ours] = [name for where, name in listed if where == "ours"]
    assert ours in ("gate", "wrapper") and ("ours", ours) in listed[2:4], listed
    assert all(
        where.startswith(TORCH_DIR) for where, _ in listed[listed.index(("ours", ours)) + 1 :]
    )
    assert "grad_health" in str(error)
