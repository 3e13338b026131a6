"""Guard gsplat_means2d against gsplat 1.5.3's real ``rasterization`` body on CPU, with
stand-ins for its CUDA kernel wrappers only (see gsplat_standins.py)."""

from __future__ import annotations

import inspect
import traceback
import warnings

import gsplat
import gsplat.rendering
import gsplat_standins
import pytest
import torch
from helpers import assert_attached

import autograd_guard
from autograd_guard.testing import capture_events

ORIGINAL = gsplat.rendering.rasterization
PLACE = "gsplat:rasterization"  # where render() and fit() call it


@pytest.fixture(autouse=True)
def cuda_standins(monkeypatch):
    for name in gsplat_standins.KERNELS:
        monkeypatch.setattr(gsplat.rendering, name, getattr(gsplat_standins, name))


@pytest.fixture
def guard():
    autograd_guard.install()


def scene(dtype=torch.float32, n=24):
    generator = torch.Generator().manual_seed(0)
    means = torch.randn(n, 3, generator=generator, dtype=dtype) * 0.4 + torch.tensor(
        [0, 0, 3.0], dtype=dtype
    )
    return dict(
        means=means.requires_grad_(),
        quats=torch.randn(n, 4, generator=generator, dtype=dtype),
        scales=(torch.rand(n, 3, generator=generator, dtype=dtype) * 0.1 + 0.08),
        opacities=torch.rand(n, generator=generator, dtype=dtype) * 0.7 + 0.2,
        colors=torch.rand(n, 3, generator=generator, dtype=dtype).requires_grad_(),
        viewmats=torch.eye(4, dtype=dtype)[None],
        Ks=torch.tensor([[[40.0, 0, 16], [0, 40.0, 16], [0, 0, 1]]], dtype=dtype),
        width=32,
        height=32,
    )


def render(packed=False, absgrad=False, offset=None, **extra):
    """Render the scene; ``offset`` is added to the projected means (finite differences)."""
    if offset is not None:
        project = gsplat.rendering.fully_fused_projection

        def shifted(*args, **kwargs):
            out = list(project(*args, **kwargs))
            index = 4 if kwargs.get("packed") else 1
            out[index] = out[index] + offset
            return tuple(out)

        gsplat.rendering.fully_fused_projection = shifted
        try:
            return gsplat.rasterization(**scene(torch.float64), packed=packed, **extra)
        finally:
            gsplat.rendering.fully_fused_projection = project
    return gsplat.rasterization(
        **scene(**extra.pop("scene", {})), packed=packed, absgrad=absgrad, **extra
    )


def loss_of(image):
    weights = torch.linspace(0.1, 1.0, image.numel(), dtype=image.dtype).reshape(image.shape)
    return (image * weights).sum()


@pytest.mark.parametrize("packed", [False, True])
def test_unguarded_grad_is_none_even_with_retain_grad_on_a_derived_tensor(packed):
    image, _, meta = render(packed)
    derived = meta["means2d"] * 1
    derived.retain_grad()  # the common mistake
    with pytest.warns(UserWarning, match="not a leaf"):
        loss_of(image).backward()
        assert meta["means2d"].grad is None
    assert derived.grad is None  # not on the loss's path either: both are lost


@pytest.mark.parametrize("packed", [False, True])
def test_guarded_grad_matches_finite_differences(guard, packed):
    with capture_events() as events:
        image, _, meta = render(packed, offset=None, scene={"dtype": torch.float64})
        means2d = meta["means2d"]
        assert means2d.shape == ((meta["gaussian_ids"].shape[0], 2) if packed else (1, 24, 2))
        loss_of(image).backward()
    assert means2d.grad is not None and means2d.grad.shape == means2d.shape
    [event] = events  # logged in backward(), where the loss of the gradient is known
    assert event["action"] == "retain_grad" and event["shape"] == list(means2d.shape)
    flat_grad = means2d.grad.reshape(-1)
    visible = torch.nonzero(flat_grad.abs() > 1e-3).flatten()[:4]
    assert len(visible) >= 2
    eps = 1e-6
    for index in visible.tolist():
        bump = torch.zeros(means2d.numel(), dtype=torch.float64)
        bump[index] = eps
        plus = loss_of(render(packed, offset=bump.reshape(means2d.shape))[0])
        minus = loss_of(render(packed, offset=-bump.reshape(means2d.shape))[0])
        numeric = ((plus - minus).detach() / (2 * eps)).item()
        assert numeric == pytest.approx(float(flat_grad[index]), rel=1e-4, abs=1e-6)


def test_absgrad(guard):
    image, _, meta = render(absgrad=True)
    loss_of(image).backward()
    assert torch.equal(meta["means2d"].absgrad, meta["means2d"].grad.abs())


def test_default_strategy_without_step_pre_backward():
    strategy = gsplat.DefaultStrategy(refine_start_iter=0, verbose=False)
    state = strategy.initialize_state()

    def step():
        data = scene()
        params = {
            k: torch.nn.Parameter(data[k].detach())
            for k in ("means", "quats", "scales", "opacities", "colors")
        }
        image, _, meta = gsplat.rasterization(**{**data, **params}, packed=False)
        loss_of(image).backward()
        strategy.step_post_backward(
            params,
            {k: torch.optim.Adam([p]) for k, p in params.items()},
            state,
            1,
            meta,
            packed=False,
        )

    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'clone'"):
        step()
    autograd_guard.install()
    step()
    assert state["count"].sum() > 0 and state["grad2d"].sum() > 0


def test_reexport_signature_and_docstring(guard):
    assert gsplat.rasterization is gsplat.rendering.rasterization
    assert gsplat.rasterization.__wrapped__ is ORIGINAL
    assert inspect.signature(gsplat.rasterization) == inspect.signature(ORIGINAL)
    assert gsplat.rasterization.__doc__ == ORIGINAL.__doc__
    autograd_guard.uninstall()
    assert gsplat.rasterization is ORIGINAL


def test_users_own_retain_grad_stays_harmless(guard):
    assert_attached("gsplat_means2d", PLACE)
    image, _, meta = render()
    meta["means2d"].retain_grad()
    loss_of(image).backward()
    assert meta["means2d"].grad is not None


def test_not_differentiable_projection_is_left_alone(guard):
    assert_attached("gsplat_means2d", PLACE)
    with capture_events() as events:
        _, _, meta = render(with_ut=True)
    assert not meta["means2d"].requires_grad and events == []


def test_no_grad_calls_pass_through(guard):
    assert_attached("gsplat_means2d", PLACE)
    with capture_events() as events, torch.no_grad():
        render()
    assert events == []


def test_observe_logs_only():
    autograd_guard.install({"extends": "default", "mode": "observe"})
    with capture_events() as events:
        image, _, meta = render()
        loss_of(image).backward()
    assert meta["means2d"].grad is None and events[0]["mode"] == "observe"


def test_the_kept_gradient_equals_retain_grads_and_accumulates_like_it(guard):
    with capture_events() as events:
        image, _, meta = render()
        loss = loss_of(image)
        loss.backward(retain_graph=True)
        kept = meta["means2d"].grad.clone()
        loss.backward()
        twice = meta["means2d"].grad.clone()
    autograd_guard.uninstall()
    image, _, meta = render()
    meta["means2d"].retain_grad()
    loss = loss_of(image)
    loss.backward(retain_graph=True)
    torch.testing.assert_close(kept, meta["means2d"].grad)
    loss.backward()
    torch.testing.assert_close(twice, meta["means2d"].grad)
    assert [e["action"] for e in events] == ["retain_grad"]


def fit(steps, retain):
    """A small 3DGS fit with gsplat's DefaultStrategy; ``retain``: the user's code calls
    strategy.step_pre_backward, as gsplat's own trainer does."""
    strategy = gsplat.DefaultStrategy(refine_start_iter=10_000, verbose=False)
    state = strategy.initialize_state()
    data = scene()
    params = torch.nn.ParameterDict(
        {
            k: torch.nn.Parameter(data[k].detach())
            for k in ("means", "quats", "scales", "opacities", "colors")
        }
    )
    optimizers = {k: torch.optim.Adam([p], lr=1e-3) for k, p in params.items()}
    for step in range(steps):
        image, _, meta = gsplat.rasterization(**{**data, **params}, packed=False)
        if retain:
            strategy.step_pre_backward(params, optimizers, state, step, meta)
        loss_of(image).backward()
        strategy.step_post_backward(params, optimizers, state, step, meta, packed=False)
        for optimizer in optimizers.values():
            optimizer.step()
            optimizer.zero_grad()
    return state


@pytest.mark.parametrize("mode", ["fix", "strict", "observe"])
def test_a_correct_default_strategy_fit_logs_nothing(mode):
    autograd_guard.install({"extends": "default", "mode": mode})
    assert_attached("gsplat_means2d", PLACE)
    with capture_events() as events:
        state = fit(30, retain=True)
    assert state["count"].sum() > 0 and events == []


def test_a_fit_that_forgets_step_pre_backward_logs_once_and_densifies(guard):
    with capture_events() as events:
        state = fit(30, retain=False)
    assert state["grad2d"].sum() > 0
    [event] = events
    assert event["action"] == "retain_grad" and event["mode"] == "fix"


def test_strict_raises_only_where_the_gradient_is_lost():
    autograd_guard.install("strict")
    image, _, meta = render()
    meta["means2d"].retain_grad()  # correct code passes
    loss_of(image).backward()
    image, _, meta = render()
    with pytest.raises(autograd_guard.GuardError, match=r"gsplat_means2d.*gradient lost"):
        loss_of(image).backward()


def test_the_kept_gradient_is_the_one_the_users_hooks_made(guard):
    # Issue 19 item 7: the guard kept the gradient before the user's hook (x10) ran.
    def means2d_grad(retain):
        image, _, meta = render()
        meta["means2d"].register_hook(lambda grad: grad * 10)
        if retain:
            meta["means2d"].retain_grad()
        loss_of(image).backward()
        return meta["means2d"].grad

    with capture_events() as events:
        kept = means2d_grad(retain=False)
    autograd_guard.uninstall()
    retained = means2d_grad(retain=True)
    assert torch.equal(kept, retained) and kept.abs().sum() > 0
    assert [e["action"] for e in events] == ["retain_grad"]


def warnings_of(work):
    """Every warning ``work()`` emits, each one (no once-per-location filtering)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        work()
    return [(w.category, str(w.message), w.filename, w.lineno) for w in caught]


def render_and_backward_twice():
    image, _, _meta = render()  # meta["means2d"] alive in backward(), as in user code
    loss = loss_of(image)
    loss.backward(retain_graph=True)
    loss.backward()


@pytest.mark.parametrize("mode", ["fix", "observe"])
def test_the_guard_adds_no_warning(mode):
    # torch warns when .grad of a non-leaf that does not retain it is read: the guard's
    # fix read meta["means2d"].grad before it kept the gradient there.
    unguarded = warnings_of(render_and_backward_twice)
    autograd_guard.install({"extends": "default", "mode": mode})
    with capture_events() as events:
        assert warnings_of(render_and_backward_twice) == unguarded
    assert [e["action"] for e in events] == ["retain_grad"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        render_and_backward_twice()
        if mode == "fix":  # unguarded, gsplat's strategy reads the lost .grad (and fails)
            assert fit(3, retain=False)["grad2d"].sum() > 0


def test_strict_adds_no_warning_to_its_error():
    autograd_guard.install("strict")
    with pytest.raises(autograd_guard.GuardError), warnings.catch_warnings():
        warnings.simplefilter("error")
        render_and_backward_twice()


def test_the_kept_gradient_reads_silently_as_retain_grads_does(guard):
    image, _, meta = render()
    loss_of(image).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert meta["means2d"].grad is not None and meta["means2d"].retains_grad


def test_strict_raises_from_backward_with_one_frame_of_the_guard():
    from autograd_guard.errors import PACKAGE_DIR

    autograd_guard.install("strict")
    image, _, _meta = render()
    with pytest.raises(autograd_guard.GuardError) as caught:
        loss_of(image).backward()
    entries = traceback.extract_tb(caught.value.__traceback__)
    assert entries[0].filename == __file__ and entries[0].line == "loss_of(image).backward()"
    ours = [e.name for e in entries if e.filename.startswith(PACKAGE_DIR)]
    # grad_health's loss check wraps Tensor.backward (its frame sits between the user's
    # line and torch's): the guard's hook is the only other frame, and the last
    assert ours in (["autograd_guard_hook"], ["backward", "autograd_guard_hook"])
    assert entries[-1].name == "autograd_guard_hook"
