"""The guard is invisible except for its remedy: the wrapped body runs once, the user's
exceptions come back as the same objects with the same context, wrappers pickle and copy
like the originals, and targets that are not functions are left alone."""

from __future__ import annotations

import copy
import json
import pickle
import sys

import pytest
import torch
from helpers import ROOT, assert_attached, run_python

import autograd_guard
from autograd_guard.testing import capture_events

STAGES = """
calls = {"n": 0}

class StageError(ValueError):
    pass

def failing_stage(x):
    calls["n"] += 1
    try:
        raise KeyError("inner")
    except KeyError as inner:
        raise StageError("user data 12345") from inner

def recursive_stage(depth):
    calls["n"] += 1
    if depth == 0:
        raise StageError("bottom")
    return recursive_stage(depth - 1)

def plain(x):
    return x + 1
"""


@pytest.fixture
def stages(make_module):
    make_module("user_stages", STAGES)
    import user_stages

    return user_stages


def _rules(*names: str, action: str = "enable_grad") -> dict[str, object]:
    return {"rules": [{"target": f"user_stages:{n}", "action": action} for n in names]}


@pytest.mark.parametrize("mode", ["observe", "fix", "strict"])
def test_a_user_exception_on_the_pass_through_path_runs_the_body_once(stages, mode):
    autograd_guard.install({"mode": mode, **_rules("failing_stage")})
    import user_stages

    assert_attached("grad_mode", "user_stages:failing_stage")
    with capture_events() as events, pytest.raises(user_stages.StageError) as raised:
        user_stages.failing_stage(1)  # grad is on: not risky
    assert user_stages.calls["n"] == 1
    error = raised.value
    assert isinstance(error.__cause__, KeyError) and error.__context__ is error.__cause__
    assert events == []


def test_a_recursive_stage_raising_deep_down_runs_each_level_once(stages):
    autograd_guard.install({"mode": "strict", **_rules("recursive_stage")})
    import user_stages

    assert_attached("grad_mode", "user_stages:recursive_stage")
    with capture_events() as events, pytest.raises(user_stages.StageError) as raised:
        user_stages.recursive_stage(15)
    assert user_stages.calls["n"] == 16
    assert raised.value.__context__ is None
    assert events == []


def test_the_library_error_on_the_risky_path_is_the_same_object(stages):
    autograd_guard.install(_rules("failing_stage"))
    import user_stages

    with torch.no_grad(), pytest.raises(user_stages.StageError) as raised:
        user_stages.failing_stage(1)  # risky: the guard re-enables grad, the body raises
    assert user_stages.calls["n"] == 1
    assert isinstance(raised.value.__cause__, KeyError)


# -- pickling and copying -----------------------------------------------------------------

PICKLED = """
import torch

def smooth(x):
    return x * 2


def rank_worker(rank, fn, out):
    torch.save(fn(torch.full((1,), float(rank))), f"{out}/{rank}.pt")

class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fn = smooth

    def step(self, x):
        return self.fn(x)

    @staticmethod
    def static_step(x):
        return x * 3


def _impl(x):
    return x * 4

alias = _impl  # exported under another name; the rule names the alias
"""


@pytest.fixture
def pickled(make_module):
    make_module("user_pickled", PICKLED)
    autograd_guard.install(
        {
            "rules": [
                {"target": f"user_pickled:{t}", "action": "enable_grad"}
                for t in ("smooth", "Holder.step", "Holder.static_step", "alias")
            ]
        }
    )
    import user_pickled

    assert hasattr(user_pickled.smooth, "__wrapped__")  # really guarded
    return user_pickled


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_a_guarded_function_pickles_by_reference(pickled, protocol):
    assert pickle.loads(pickle.dumps(pickled.smooth, protocol)) is pickled.smooth


def test_a_guarded_function_copies_as_itself(pickled):
    assert copy.copy(pickled.smooth) is pickled.smooth
    assert copy.deepcopy(pickled.smooth) is pickled.smooth
    assert copy.deepcopy({"f": pickled.smooth})["f"] is pickled.smooth


def test_a_guarded_method_pickles_like_a_bound_method(pickled):
    holder = pickled.Holder()
    clone = pickle.loads(pickle.dumps(holder.step))
    assert clone(torch.ones(2)).tolist() == [2.0, 2.0]
    assert copy.deepcopy(holder).step(torch.ones(1)).item() == 2.0


def test_a_module_holding_a_guarded_function_saves_and_deep_copies(pickled, tmp_path):
    holder = pickled.Holder()
    torch.save(holder, tmp_path / "holder.pt")
    loaded = torch.load(tmp_path / "holder.pt", weights_only=False)
    assert loaded.fn is pickled.smooth
    assert copy.deepcopy(holder).fn is pickled.smooth


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_static_methods_methods_through_the_class_and_aliases_pickle(pickled, protocol):
    Holder, x = pickled.Holder, torch.ones(1)
    calls = [
        (Holder.static_step, (x,)),
        (Holder().static_step, (x,)),
        (Holder.step, (Holder(), x)),
        (pickled.alias, (x,)),
    ]
    for guarded, args in calls:
        assert hasattr(guarded, "__wrapped__")  # really guarded
        clone = pickle.loads(pickle.dumps(guarded, protocol))
        assert clone(*args).item() == guarded(*args).item()
    assert pickle.loads(pickle.dumps(pickled.alias, protocol)) is pickled.alias


def test_a_deep_copied_model_keeps_its_own_guarded_bound_method(pickled):
    holder = pickled.Holder()
    holder.bound = holder.step  # a model keeping one of its own methods, as hooks are kept
    clone = copy.deepcopy(holder)
    assert clone.bound.__self__ is clone and holder.bound.__self__ is holder
    assert clone.bound(torch.ones(1)).item() == 2.0


def test_spawned_workers_map_a_static_method_and_an_alias(pickled):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as executor:
        assert [t.item() for t in executor.map(pickled.Holder.static_step, [torch.ones(1)])] == [
            3.0
        ]
        assert executor.submit(pickled.alias, torch.ones(1)).result().item() == 4.0


def test_spawned_workers_receive_a_guarded_function(pickled):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        assert [t.item() for t in pool.map(pickled.smooth, [torch.ones(1)] * 3)] == [2.0] * 3
    with ProcessPoolExecutor(1, mp_context=context) as executor:
        assert executor.submit(pickled.smooth, torch.ones(1)).result().item() == 2.0


def test_torch_multiprocessing_spawn_passes_a_guarded_function(pickled, tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(pickled.rank_worker, args=(pickled.smooth, str(tmp_path)), nprocs=2)
    assert [torch.load(tmp_path / f"{r}.pt").item() for r in (0, 1)] == [0.0, 2.0]


# -- targets that are not functions -------------------------------------------------------

VALUES = """
import torch

PI = 3.14159
SEP = "/"

def present(x):
    return x

class Shape:
    sides = 4

    def __init__(self):
        self.calls = 0

    @property
    def area(self):
        self.calls += 1
        x = torch.ones(1, requires_grad=True)
        return (x * 2).requires_grad
"""


@pytest.fixture
def values(make_module):
    make_module("user_values", VALUES)


def test_values_are_left_untouched_with_one_event_each(values):
    names = ("PI", "SEP", "Shape.sides", "missing", "Shape.absent")
    with capture_events() as events:
        autograd_guard.install(
            {"rules": [{"target": f"user_values:{n}", "action": "enable_grad"} for n in names]}
        )
        import user_values
    events = [e for e in events if e.get("target", "").startswith("user_values:")]
    assert user_values.PI == 3.14159 and type(user_values.PI) is float
    assert type(user_values.SEP) is str and user_values.Shape.sides == 4
    assert sorted(e["target"] for e in events) == sorted(f"user_values:{n}" for n in names)
    assert all(e["action"] == "bad_target" and e["level"] == "error" for e in events)
    [missing] = [e for e in events if e["target"] == "user_values:missing"]
    assert "module 'user_values' has no attribute 'missing'" in missing["event"]
    assert (
        missing["rule"] == "<dict>: rules[3]" and "(named by <dict>: rules[3])" in missing["event"]
    )
    assert "enable_grad" not in missing["remedy"]


def test_a_property_target_runs_its_getter_with_grad(values):
    autograd_guard.install(
        {"rules": [{"target": "user_values:Shape.area", "action": "enable_grad"}]}
    )
    import user_values

    shape = user_values.Shape()
    with torch.no_grad(), capture_events() as events:
        assert shape.area is True  # grad was on inside the getter
    assert shape.calls == 1 and len(events) == 1
    autograd_guard.uninstall()
    with torch.no_grad():
        assert shape.area is False


@pytest.mark.parametrize("target", ["math:pi", "os:system", "builtins:print", "os.path:join"])
def test_rules_on_python_itself_are_refused(target):
    with pytest.raises(autograd_guard.PolicyError, match=r"rules\[0\]\.target.*Python itself"):
        autograd_guard.install({"rules": [{"target": target, "action": "enable_grad"}]})


def test_rules_on_the_script_being_run_are_refused_with_a_reason():
    with pytest.raises(autograd_guard.PolicyError, match="script being run"):
        autograd_guard.install({"rules": [{"target": "__main__:stage", "action": "snapshot"}]})


# -- recursion -----------------------------------------------------------------------------

RECURSIVE = """
import sys

def down(n, limit=None):
    if n == 0:
        if limit:
            sys.setrecursionlimit(limit)
        return sys.getrecursionlimit()
    return down(n - 1, limit)

def walk(x, n):
    return x if n == 0 else walk(x * 0.5, n - 1)
"""

# Run in a child: the recursion limit is the interpreter's, and threads left by other
# tests would keep the levels from being given back (see _recursion).
DEPTHS = """
import json, sys, threading
import torch
import autograd_guard
autograd_guard.install({"rules": [
    {"target": "user_recursive:down", "action": "enable_grad"},
    {"target": "user_recursive:walk", "action": "snapshot"},
]})
import user_recursive as r

def deepest(function):
    low, high = 1, 3 * sys.getrecursionlimit()
    while low < high:
        middle = (low + high + 1) // 2
        try:
            function(middle)
            low = middle
        except RecursionError:
            high = middle - 1
    return low

limit = sys.getrecursionlimit()
result = {"limit": limit, "down": deepest(r.down), "inside": r.down(10)}
result["walk"] = deepest(lambda n: r.walk(torch.ones(1), n))
result["after"] = sys.getrecursionlimit()
depths = []
threads = [threading.Thread(target=lambda: depths.append(deepest(r.down))) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
result["in_threads"] = depths
result["set_inside"] = r.down(10, limit + 500)
result["after_set"] = sys.getrecursionlimit()
print(json.dumps(result))
"""


def test_a_recursive_target_costs_one_frame_per_level(tmp_path):
    # Issue 19 item 12: unguarded ~990 levels; guarded ~330 (enable_grad), ~190 (snapshot).
    (tmp_path / "user_recursive.py").write_text(RECURSIVE)
    out = run_python(sys.executable, DEPTHS, tmp_path, PYTHONPATH=str(ROOT)).stdout
    result = json.loads(out)
    limit = result["limit"]
    assert result["down"] >= 0.45 * limit and result["walk"] >= 0.45 * limit
    assert result["after"] == limit  # every level given back was taken back
    assert result["inside"] >= limit  # read inside: higher by the levels given back
    # Threads recursing at once: nothing given back (lowering the interpreter's limit under
    # another thread's depth made CPython abort), and nothing aborted.
    assert len(result["in_threads"]) == 4 and min(result["in_threads"]) >= 0.3 * limit
    assert result["set_inside"] == result["after_set"] == limit + 500  # the program's own
