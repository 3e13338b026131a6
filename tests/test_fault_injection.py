"""Fault injection: each guard's internal steps made to raise. In observe and fix the
call returns what the library alone returns and the failure is reported once as an
event; in strict the guard's error is raised."""

from __future__ import annotations

import sys

import gsplat
import gsplat.rendering
import gsplat_standins
import pytest
import torch
import torch.nn.functional as F
from helpers import STAGE_SOURCE, ipex_standin
from pytorch3d.ops import taubin_smoothing
from pytorch3d.structures import Meshes
from pytorch3d.utils import ico_sphere

import autograd_guard
from autograd_guard._common import versions as _versions
from autograd_guard._events import events as _events
from autograd_guard._runtime.guard import Guard
from autograd_guard.guards import available
from autograd_guard.testing import capture_events

GUARDS = {g.name: g for g in available()}
FAULTS = ("version lookup", "hook", "check", "remedy", "remedy after the library")


class Injected(Exception):
    pass


def outcome(function):
    """What a call did: its value (as plain data) or the exception it raised."""
    try:
        value = function()
    except Exception as exc:
        return ("raised", type(exc).__name__, str(exc).split("\n")[0])
    return ("returned", value)


def grad_mode_call(make_module):
    make_module("mesh_reconstruction.recon", STAGE_SOURCE)
    import mesh_reconstruction.recon as recon

    def call():
        with torch.no_grad():
            return recon.reconstruct_stage1(torch.ones(3))[1]

    return {"extends": "unique3d"}, call


def taubin_call(make_module):
    mesh = ico_sphere(1)

    def call():
        verts = mesh.verts_packed().clone().requires_grad_()
        out = taubin_smoothing(Meshes(verts=[verts], faces=[mesh.faces_packed()]), num_iter=2)
        return out.verts_packed().detach().round(decimals=4).tolist()

    return {}, call


def gsplat_call(make_module):
    def call():
        torch.manual_seed(0)
        means = (torch.randn(8, 3) * 0.3 + torch.tensor([0, 0, 3.0])).requires_grad_()
        image, _, meta = gsplat.rasterization(
            means,
            torch.randn(8, 4),
            torch.rand(8, 3) * 0.1 + 0.1,
            torch.rand(8),
            torch.rand(8, 3),
            torch.eye(4)[None],
            torch.tensor([[[20.0, 0, 8], [0, 20.0, 8], [0, 0, 1]]]),
            16,
            16,
            packed=False,
        )
        return image.detach().round(decimals=5).tolist(), meta["means2d"].retains_grad

    return {}, call


def snapshot_call(make_module):
    make_module("fault_ops", "def raw(x):\n    x.numpy()[0] = 9.0\n    return x.sum().item()\n")
    import fault_ops

    def call():
        x = torch.zeros(3)
        return fault_ops.raw(x), x.tolist()

    policy = {"rules": [{"target": "fault_ops:raw", "action": "snapshot", "check": "data"}]}
    return policy, call


def ipex_call(make_module, tmp_path):
    site = ipex_standin(tmp_path / "ipex-site", "2.1.20+xpu")
    sys.path.insert(0, str(site))
    _versions.clear_cache()
    import intel_extension_for_pytorch  # noqa: F401

    def call():
        torch.manual_seed(0)
        with torch.no_grad():
            return F.dropout(torch.ones(6), 0.5, True).tolist()

    return {"guards": {"ipex_xpu": {"devices": ["cpu"]}}}, call


SCENARIOS = {
    "grad_mode": grad_mode_call,
    "pytorch3d_taubin": taubin_call,
    "gsplat_means2d": gsplat_call,
    "snapshot_inputs": snapshot_call,
    "ipex_xpu": ipex_call,
}


@pytest.fixture(autouse=True)
def _gsplat_standins(monkeypatch):
    for name in gsplat_standins.KERNELS:
        monkeypatch.setattr(gsplat.rendering, name, getattr(gsplat_standins, name))
    yield
    sys.modules.pop("intel_extension_for_pytorch", None)
    sys.path[:] = [p for p in sys.path if not p.endswith("ipex-site")]


def inject(monkeypatch, guard_class: type[Guard], fault: str) -> None:
    def boom(*args, **kwargs):
        raise Injected(fault)

    if fault == "version lookup":  # for this guard's distribution only
        real = _versions.first_installed

        def lookup(distribution):
            if distribution == guard_class.distribution:
                raise Injected(fault)
            return real(distribution)

        monkeypatch.setattr(_versions, "first_installed", lookup)
    elif fault == "hook":
        monkeypatch.setattr(guard_class, "_attach", boom)
    elif guard_class.before is not Guard.before:  # checks around the call (snapshot_inputs)
        if fault in ("check", "remedy"):
            monkeypatch.setattr(guard_class, "before", boom)
        else:

            def fail_after(self, call):
                def after():
                    raise Injected(fault)

                return after

            monkeypatch.setattr(guard_class, "before", fail_after)
    elif fault == "check":
        monkeypatch.setattr(guard_class, "_check_for", lambda self, target: boom)
    elif fault == "remedy":
        monkeypatch.setattr(guard_class, "_handler_for", lambda self, target: boom)
    else:

        def proceed_then_fail(call):
            call.proceed()
            raise Injected(fault)

        monkeypatch.setattr(guard_class, "_handler_for", lambda self, target: proceed_then_fail)


# Guards without a distribution (application code, user rules) have no version lookup.
CASES = [
    (name, fault)
    for name in SCENARIOS
    for fault in FAULTS
    if fault != "version lookup" or GUARDS[name].distribution is not None
]


@pytest.mark.parametrize("mode", ["observe", "fix"])
@pytest.mark.parametrize(("name", "fault"), CASES)
def test_fail_open(name, mode, fault, make_module, tmp_path, monkeypatch):
    args = (make_module, tmp_path) if name == "ipex_xpu" else (make_module,)
    policy, call = SCENARIOS[name](*args)
    library_alone = outcome(call)
    inject(monkeypatch, GUARDS[name], fault)
    with capture_events() as events:
        autograd_guard.install({**policy, "mode": mode})
        assert outcome(call) == library_alone
        assert outcome(call) == library_alone
    errors = [e for e in events if e["action"] == "guard_error"]
    if fault == "remedy after the library" and library_alone[0] == "raised":
        assert errors == []  # the library's own error came first, unchanged
        return
    if fault == "version lookup":  # each guard of that distribution fails its own lookup
        distribution = GUARDS[name].distribution
        assert {GUARDS[e["guard"]].distribution for e in errors} == {distribution}, events
        errors = [e for e in errors if e["guard"] == name]
    assert len(errors) == 1 and "Injected" in errors[0]["error"], events  # the type's name
    assert errors[0]["guard"] == name


@pytest.mark.parametrize(("name", "fault"), CASES)
def test_strict_raises_the_guard_error(name, fault, make_module, tmp_path, monkeypatch):
    args = (make_module, tmp_path) if name == "ipex_xpu" else (make_module,)
    policy, call = SCENARIOS[name](*args)
    if fault == "remedy after the library" and outcome(call)[0] == "raised":
        pytest.skip("the library raises first: its own error passes, as test_fail_open shows")
    inject(monkeypatch, GUARDS[name], fault)
    with pytest.raises(autograd_guard.GuardError, match=f"{name}.*Injected"):
        autograd_guard.install({**policy, "mode": "strict"})  # a late patch fails here...
        call()  # ...the others at the call


def test_a_broken_event_sink_never_breaks_the_call(make_module, monkeypatch, capsys):
    policy, call = grad_mode_call(make_module)

    def broken_logger():
        raise Injected("sink")

    monkeypatch.setattr(_events, "_logger", broken_logger)
    autograd_guard.install(policy)
    assert outcome(call)[0] == "returned"  # the fix still applies
    assert "could not log an event: Injected" in capsys.readouterr().err
