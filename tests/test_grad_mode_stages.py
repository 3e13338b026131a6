"""grad_mode with the stages users write: list and dict arguments next to inference
tensors, generator stages under decorators, classmethod stages (issue 19 items 1, 6, 13)."""

from __future__ import annotations

import pytest
import torch

import autograd_guard
from autograd_guard.testing import capture_events


@pytest.fixture
def grad_off():
    previous = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    yield
    torch.set_grad_enabled(previous)


CONTAINERS = """
import torch

SEEN = []

def fit(target, batch, out):
    SEEN.append((batch, out))
    w = torch.zeros_like(target, requires_grad=True)
    ((w - target) ** 2).sum().backward()
    batch["grad"] = w.grad
    out.append("fit")
    return w.grad

def normalise(batch):
    batch["points"].div_(2)
    batch["scale"] = torch.ones(1, requires_grad=True) * 2
    del batch["stale"]
    batch["items"].append(batch["points"])
"""


@pytest.fixture
def containers(make_module):
    make_module("user_containers", CONTAINERS)
    rules = [
        {"target": f"user_containers:{n}", "action": "enable_grad"} for n in ("fit", "normalise")
    ]
    autograd_guard.install({"rules": rules})
    import user_containers

    return user_containers


def test_containers_without_an_inference_tensor_are_the_callers_own(containers):
    # Issue 19 item 1: every list and dict argument was copied, and the writes were lost.
    batch, out = {"steps": 1}, []
    with torch.inference_mode():
        grad = containers.fit(torch.arange(3.0), batch, out)
    [(seen_batch, seen_out)] = containers.SEEN
    assert seen_batch is batch and seen_out is out
    assert batch["grad"] is grad and out == ["fit"]


def test_writes_into_a_copied_dict_and_list_reach_the_callers(containers):
    with torch.inference_mode():
        points = torch.full((2,), 4.0)
        items = [points]
        batch = {"points": points, "stale": 1, "items": items}
        with capture_events() as events:
            containers.normalise(batch)
    assert sorted(batch) == ["items", "points", "scale"] and batch["points"] is points
    assert points.tolist() == [2.0, 2.0] and points.is_inference()
    assert items == [points, points] and items[1] is points  # the clone maps back
    assert batch["scale"].requires_grad  # made with grad, inside the stage
    assert [e["action"] for e in events] == ["enable_grad", "copy_back"]


DECORATED = """
import functools
import torch

def lazy_decorator(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)
    return wrapper

def consuming_decorator(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return list(function(*args, **kwargs))
    return wrapper

@lazy_decorator
def lazy(n):
    for _ in range(n):
        yield torch.is_grad_enabled()

@consuming_decorator
def consumed(n):
    for _ in range(n):
        yield torch.is_grad_enabled()
"""


@pytest.mark.parametrize("mode", ["fix", "observe"])
def test_a_decorated_generator_stage_gets_grad_where_its_body_runs(make_module, grad_off, mode):
    # Issue 19 item 6: functools.wraps hid the generator; "re-enabled" was logged at the
    # call, and the body then ran without grad.
    make_module("user_decorated", DECORATED)
    rules = [
        {"target": f"user_decorated:{n}", "action": "enable_grad"} for n in ("lazy", "consumed")
    ]
    autograd_guard.install({"mode": mode, "rules": rules})
    import user_decorated

    fixed = mode == "fix"
    with capture_events() as events:
        assert list(user_decorated.lazy(2)) == [fixed, fixed]
    assert [e["action"] for e in events] == ["enable_grad"]
    with capture_events() as events:
        assert user_decorated.consumed(2) == [fixed, fixed]  # the body ran inside the call
    assert [e["action"] for e in events] == (["enable_grad"] if fixed else [])


def test_a_classmethod_stage_is_guarded_and_bound_to_the_subclass(make_module, grad_off):
    # Issue 19 item 13: a classmethod target was refused as "not a function".
    make_module(
        "user_classmethod",
        """
        import torch

        class Mesh:
            @classmethod
            def fitted(cls, target):
                w = torch.zeros_like(target, requires_grad=True)
                ((w - target) ** 2).sum().backward()
                return cls, w.grad

        class Sphere(Mesh):
            pass
        """,
    )
    with capture_events() as events:
        autograd_guard.install(
            {"rules": [{"target": "user_classmethod:Mesh.fitted", "action": "enable_grad"}]}
        )
        import user_classmethod

        kind, grad = user_classmethod.Sphere.fitted(torch.ones(2))
    assert kind is user_classmethod.Sphere and grad.tolist() == [-2.0, -2.0]
    assert [e["action"] for e in events if e["guard"] == "grad_mode"] == ["enable_grad"]
    autograd_guard.uninstall()
    assert isinstance(vars(user_classmethod.Mesh)["fitted"], classmethod)
