"""Guard grad_mode against the Unique3D situation: grad disabled in __main__, the stage
called on the main thread (AiuniAI/Unique3D#19, #105)."""

from __future__ import annotations

import sys
import threading

import pytest
import torch
from helpers import STAGE_SOURCE, assert_attached

import autograd_guard
from autograd_guard.testing import capture_events

NO_GRAD = "does not require grad and does not have a grad_fn"
STAGE = "mesh_reconstruction.recon:reconstruct_stage1"


@pytest.fixture
def stage_module(make_module):
    make_module("mesh_reconstruction.recon", STAGE_SOURCE)


@pytest.fixture
def grad_off():
    previous = torch.is_grad_enabled()
    torch.set_grad_enabled(False)  # what Unique3D's gradio_app.py does under __main__
    yield
    torch.set_grad_enabled(previous)


def test_unguarded_main_thread_fails(stage_module, grad_off):
    from mesh_reconstruction.recon import reconstruct_stage1

    with pytest.raises(RuntimeError, match=NO_GRAD):
        reconstruct_stage1(torch.ones(4))


def test_unguarded_worker_thread_works(stage_module, grad_off):
    from mesh_reconstruction.recon import reconstruct_stage1

    results = []
    worker = threading.Thread(target=lambda: results.append(reconstruct_stage1(torch.ones(4))))
    worker.start()
    worker.join()
    verts, loss = results[0]
    assert loss < 0.5 and torch.allclose(verts, torch.ones(4), atol=0.5)


def test_guarded_main_thread_works_and_logs(stage_module, grad_off):
    autograd_guard.install("unique3d")  # the unique3d preset names this stage
    from mesh_reconstruction.recon import reconstruct_stage1

    with capture_events() as events:
        line = sys._getframe().f_lineno + 1
        _, loss = reconstruct_stage1(torch.ones(4))
    assert loss < 0.5
    assert not torch.is_grad_enabled()  # the caller's mode is back
    [event] = events
    assert event["guard"] == "grad_mode" and event["action"] == "enable_grad"
    assert event["target"] == STAGE
    assert event["callsite"] == f"{__file__}:{line}"
    assert event["cause"] == "grad disabled"


def test_guarded_inside_inference_mode(stage_module):
    autograd_guard.install("unique3d")
    from mesh_reconstruction.recon import reconstruct_stage1

    with capture_events() as events, torch.inference_mode():
        target = torch.ones(4)  # an inference tensor: autograd cannot save it
        _, loss = reconstruct_stage1(target)
        assert torch.is_inference_mode_enabled()
    assert loss < 0.5
    assert events[0]["cause"] == "inference mode" and events[0]["cloned_inference_tensors"] == 1
    assert target.is_inference()  # the caller's tensor is untouched


def test_unguarded_inference_mode_fails(stage_module):
    from mesh_reconstruction.recon import reconstruct_stage1

    with torch.inference_mode(), pytest.raises(RuntimeError):
        reconstruct_stage1(torch.ones(4))


def test_no_event_when_grad_is_on(stage_module):
    autograd_guard.install("unique3d")
    from mesh_reconstruction.recon import reconstruct_stage1

    assert_attached("grad_mode", STAGE)
    with capture_events() as events:
        reconstruct_stage1(torch.ones(4))
    assert events == []


def test_observe_keeps_the_failure_and_explains_it(stage_module, grad_off):
    autograd_guard.install({"extends": "unique3d", "mode": "observe"})
    from mesh_reconstruction.recon import reconstruct_stage1

    with capture_events() as events, pytest.raises(RuntimeError, match=NO_GRAD) as info:
        reconstruct_stage1(torch.ones(4))
    assert events[0]["mode"] == "observe"
    assert any("entered with grad disabled" in note for note in info.value.__notes__)


def test_strict_raises_before_the_stage_runs(stage_module, grad_off):
    autograd_guard.install({"extends": "unique3d", "mode": "strict"})
    from mesh_reconstruction.recon import reconstruct_stage1

    with pytest.raises(autograd_guard.GuardError, match=r"grad_mode.*Remedy"):
        reconstruct_stage1(torch.ones(4))


def test_a_stage_that_detaches_still_fails_with_a_note(make_module, grad_off):
    make_module(
        "my_pipeline.stages",
        """
        import torch
        def fit(x):
            y = (x * 2).detach()
            y.sum().backward()
    """,
    )
    autograd_guard.install(
        {"rules": [{"target": "my_pipeline.stages:fit", "action": "enable_grad"}]}
    )
    from my_pipeline.stages import fit

    with pytest.raises(RuntimeError, match=NO_GRAD) as info:
        fit(torch.ones(2, requires_grad=True))
    assert any("grad was re-enabled" in note for note in info.value.__notes__)


def test_user_rule_on_a_method(make_module, grad_off):
    make_module(
        "my_pipeline.model",
        """
        import torch
        class Refiner:
            def refine(self, x):
                w = torch.zeros(1, requires_grad=True)
                ((w - x) ** 2).sum().backward()
                return w.grad.clone()
    """,
    )
    autograd_guard.install(
        {"rules": [{"target": "my_pipeline.model:Refiner.refine", "action": "enable_grad"}]}
    )
    from my_pipeline.model import Refiner

    assert Refiner().refine(torch.ones(1)).item() == pytest.approx(-2.0)


RESUMABLE = """
import torch

def stage_generator(n):
    seen = []
    for i in range(n):
        received = yield torch.is_grad_enabled()
        seen.append(received)
    return seen

def stage_throwing():
    try:
        yield torch.is_grad_enabled()
    except KeyError:
        yield ("caught", torch.is_grad_enabled())

async def stage_coroutine(hops):
    import asyncio
    states = []
    for _ in range(hops):
        states.append(torch.is_grad_enabled())
        await asyncio.sleep(0)
    x = torch.ones(1, requires_grad=True)
    (x * 2).sum().backward()
    return states, x.grad.item()

async def stage_async_generator(n):
    import asyncio
    for _ in range(n):
        await asyncio.sleep(0)
        yield torch.is_grad_enabled()

def fill(out, value):
    out.fill_(value)
    x = torch.ones(1, requires_grad=True)
    (x * out.sum()).sum().backward()
    return x.grad.item()
"""


@pytest.fixture
def resumable(make_module):
    make_module("user_resumable", RESUMABLE)
    names = (
        "stage_generator",
        "stage_throwing",
        "stage_coroutine",
        "stage_async_generator",
        "fill",
    )
    autograd_guard.install(
        {"rules": [{"target": f"user_resumable:{n}", "action": "enable_grad"} for n in names]}
    )
    import user_resumable

    return user_resumable


def test_a_generator_stage_has_grad_at_every_resume(resumable, grad_off):
    with capture_events() as events:
        generator = resumable.stage_generator(3)
        assert next(generator) is True
        assert not torch.is_grad_enabled()  # the caller's mode between resumes
        assert generator.send("a") is True
        assert not torch.is_grad_enabled()
        assert generator.send("b") is True
        with pytest.raises(StopIteration) as stop:
            generator.send("c")
    assert stop.value.value == ["a", "b", "c"]
    assert [e["action"] for e in events] == ["enable_grad"]


def test_a_generator_stage_receives_thrown_exceptions(resumable, grad_off):
    generator = resumable.stage_throwing()
    assert next(generator) is True
    assert generator.throw(KeyError("x")) == ("caught", True)
    generator.close()
    assert not torch.is_grad_enabled()


def test_a_coroutine_stage_has_grad_across_awaits(resumable, grad_off):
    import asyncio

    async def caller():
        result = await resumable.stage_coroutine(3)
        return result, torch.is_grad_enabled()

    (states, grad), caller_grad = asyncio.run(caller())
    assert states == [True, True, True] and grad == 2.0
    assert caller_grad is False


def test_an_async_generator_stage_has_grad_at_every_resume(resumable, grad_off):
    import asyncio

    async def caller():
        seen = []
        async for state in resumable.stage_async_generator(3):
            seen.append((state, torch.is_grad_enabled()))
        return seen

    assert asyncio.run(caller()) == [(True, False)] * 3


def test_a_generator_stage_with_grad_on_is_silent(resumable):
    assert_attached("grad_mode", "user_resumable:stage_generator")
    with capture_events() as events:
        assert list(resumable.stage_generator(2)) == [True, True]
    assert events == []


def test_writes_into_a_cloned_inference_tensor_reach_the_caller(resumable):
    with torch.inference_mode(), capture_events() as events:
        out = torch.zeros(3)
        grad = resumable.fill(out, 2.0)
    assert out.tolist() == [2.0, 2.0, 2.0] and grad == 6.0
    assert out.is_inference()
    assert [e["action"] for e in events] == ["enable_grad", "copy_back"]
