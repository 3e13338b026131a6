"""grad_audit's judgement of injected gradients through the library call, against a
stand-in library, named as one (``injlib``: a package with its dist-info, installed
outside the working directory) that
computes a loss and its gradient in NumPy and hands both to torch through an injector, as
POT does: a wrong gradient named, a right one judged and silent, and the program exactly
as unguarded where the library writes what it is given, prints, warns or draws random
numbers. Real POT: tests/test_grad_audit_pot.py."""

from __future__ import annotations

import importlib
import sys
import textwrap
import warnings

import pytest
import torch
from packaging.version import Version as _Version

import autograd_guard
from autograd_guard.guards.grad_audit import injected
from autograd_guard.testing import capture_events

pytestmark = [
    *globals().get("pytestmark", []),
    pytest.mark.skipif(
        _Version(torch.__version__.split("+")[0]) < _Version("2.2"),
        reason="grad_audit stands down on torch < 2.2",
    ),
]

LIBRARY = '''
import warnings
import torch


class Inject(torch.autograd.Function):
    @staticmethod
    def forward(ctx, value, grads, *inputs):
        ctx.grads = grads
        return value

    @staticmethod
    def backward(ctx, grad):
        return (None, None) + tuple(grad * g for g in ctx.grads)


def _inject(value, inputs, grads):
    return Inject.apply(value, grads, *inputs)


def energy(x, w, sign=1.0, verbose=False, warn=False, bump=False, noise=False):
    """sum(w * x ** 2), its gradient computed by hand: sign=-1 gets x's wrong."""
    if bump:  # a library that writes what it is given
        with torch.no_grad():
            w.add_(1e-3)
    if warn:
        warnings.warn("injlib: this call warns", UserWarning)
    if verbose:
        print("injlib: solving")
    xs, ws = x.detach().double().numpy(), w.detach().double().numpy()
    value = float((ws * xs**2).sum())
    if noise:
        value += float(torch.rand(())) * 0.0
    gx, gw = sign * 2 * ws * xs, xs**2
    return _inject(
        torch.tensor(value, dtype=x.dtype),
        (x, w),
        (torch.from_numpy(gx).to(x.dtype), torch.from_numpy(gw).to(w.dtype)),
    )


def energy_rebound(x, w):
    """The same, its parameters rebound to NumPy copies (as POT's emd2 does)."""
    x0, w0 = x, w
    x, w = x.detach().double().numpy(), w.detach().double().numpy()
    value = float((w * x**2).sum())
    return _inject(
        torch.tensor(value, dtype=x0.dtype),
        (x0, w0),
        (torch.from_numpy(2 * w * x).to(x0.dtype), torch.from_numpy(x**2).to(w0.dtype)),
    )
'''


@pytest.fixture(scope="module")
def injlib(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    (site / "injlib").mkdir()
    (site / "injlib" / "__init__.py").write_text(textwrap.dedent(LIBRARY))
    info = site / "injlib-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: injlib\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("injlib\n")
    sys.path.insert(0, str(site))
    try:
        yield importlib.import_module("injlib")
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("injlib", None)


def leaves(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(5, generator=gen, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(5, generator=gen, dtype=torch.float64) + 0.5).requires_grad_()
    return x, w


def run(step, mode=None, **options):
    """(what ``step()`` returned, its events, the audits skipped, the judgements)."""
    judged, judge = [], injected.Injected.judge

    def recorded(self, *args):
        judged.append(judge(self, *args))
        return judged[-1]

    if mode is not None:
        autograd_guard.install({"mode": mode, "guards": {"grad_audit": options}})
    injected.Injected.judge = recorded
    try:
        with capture_events() as events:
            result = step()
        skipped = {}
        if mode is not None:
            skipped = autograd_guard.status()["guards"]["grad_audit"]["notes"]["audits_skipped"]
    finally:
        injected.Injected.judge = judge
        if mode is not None:
            autograd_guard.uninstall()
    return result, [e for e in events if e["action"] != "summary"], skipped, judged


def grads(function, **options):
    x, w = leaves()
    function(x, w, **options).backward()
    return x.grad, w.grad


def verdicts(judged):
    return [v if isinstance(v, str) else [(p, n.wrong(k)) for p, n, k in v] for v in judged]


@pytest.mark.parametrize("mode", ["observe", "fix"])
def test_a_wrong_injected_gradient_is_named_at_the_library_call(injlib, mode):
    bare, _, _, _ = run(lambda: grads(injlib.energy, sign=-1.0))
    got, events, _, judged = run(lambda: grads(injlib.energy, sign=-1.0), mode)
    assert all(torch.equal(a, b) for a, b in zip(got, bare, strict=True))  # never changed
    [event] = events
    assert event["action"] == "wrong_gradient" and event["function"] == "injlib.energy"
    assert "argument x" in event["event"] and event["callsite"].startswith(__file__)
    assert verdicts(judged) == [[("x", True), ("w", False)]]


def test_strict_raises_at_the_backward(injlib):
    with pytest.raises(autograd_guard.GuardError, match=r"injlib\.energy injects a gradient"):
        run(lambda: grads(injlib.energy, sign=-1.0), "strict")


@pytest.mark.parametrize("name", ["energy", "energy_rebound"])
def test_a_right_injected_gradient_is_judged_and_silent(injlib, name):
    function = getattr(injlib, name)
    bare, _, _, _ = run(lambda: grads(function))
    got, events, skipped, judged = run(lambda: grads(function), "fix")
    assert events == [] and skipped == {}
    assert all(torch.equal(a, b) for a, b in zip(got, bare, strict=True))
    assert verdicts(judged) == [[("x", False), ("w", False)]]


def test_a_library_call_named_in_skip_is_not_judged_and_noted_nowhere(injlib):
    _, events, skipped, judged = run(
        lambda: grads(injlib.energy, sign=-1.0), "strict", skip=["injlib.energy"]
    )
    assert events == [] and judged == [] and skipped == {}


def test_a_library_that_writes_what_it_is_given_leaves_the_callers_tensors_alone(injlib):
    # the re-calls get copies: the caller's weight moves once, as unguarded (it moved
    # once per re-call before), and a re-call that does not give the value again judges
    # nothing
    def step():
        x, w = leaves()
        injlib.energy(x, w, bump=True).backward()
        return w.detach().clone(), x.grad

    bare, _, _, _ = run(step)
    got, events, skipped, _ = run(step, "observe")
    assert events == [] and torch.equal(got[0], bare[0]) and torch.equal(got[1], bare[1])
    assert "did not give the injected value again" in skipped["injlib.Inject"], skipped


def test_a_verbose_call_is_not_re_called(injlib, capsys):
    run(lambda: grads(injlib.energy, verbose=True))
    unguarded = capsys.readouterr().out
    _, events, skipped, judged = run(lambda: grads(injlib.energy, verbose=True), "observe")
    assert capsys.readouterr().out == unguarded == "injlib: solving\n"
    assert events == [] and judged == []
    assert "asked to print its progress" in skipped["injlib.Inject"], skipped


def test_the_re_calls_warnings_are_not_shown(injlib):
    def warned(mode):
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("always")
            _, events, _, judged = run(lambda: grads(injlib.energy, warn=True), mode)
        return [str(w.message) for w in shown], events, judged

    bare, _, _ = warned(None)
    guarded, events, judged = warned("observe")
    assert guarded == bare == ["injlib: this call warns"] and events == []
    assert verdicts(judged) == [[("x", False), ("w", False)]]  # judged all the same


def test_a_library_call_drawing_random_numbers_is_not_judged_and_the_stream_is_kept(injlib):
    def step():
        torch.manual_seed(5)
        result = grads(injlib.energy, noise=True)
        return result, torch.rand(3)  # the user's next draw

    (bare, draw), _, _, _ = run(step)
    (got, guarded_draw), events, _, judged = run(step, "observe")
    assert events == [] and torch.equal(draw, guarded_draw)
    assert all(torch.equal(a, b) for a, b in zip(got, bare, strict=True))
    assert judged == ["its library call injlib.energy draws random numbers"]


def test_the_program_s_own_injector_is_not_re_called(injlib, monkeypatch):
    # run from the library's folder: it is the program's own code there
    monkeypatch.chdir(injlib.__file__.rsplit("/injlib/", 1)[0])
    importlib.import_module("autograd_guard.guards.grad_audit.library")._INSTALLED.clear()
    try:
        _, events, skipped, judged = run(lambda: grads(injlib.energy, sign=-1.0), "observe")
    finally:
        importlib.import_module("autograd_guard.guards.grad_audit.library")._INSTALLED.clear()
    assert events == [] and judged == []
    assert "not an installed library" in skipped["injlib.Inject"], skipped
