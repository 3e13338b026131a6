"""Guard warp_tape against real Warp on CPU, 1.5.1 and 1.19.0 (every version is affected),
each in child interpreters of its own: every write that it sees, in every mode; Warp's
own idioms, silent and bit-identical; and a fitting loop in the user's shape."""

from __future__ import annotations

import pytest
from test_warp import PREAMBLE, run

VERSIONS = ["1.5.1", "1.19.0"]


@pytest.fixture(scope="module")
def warp_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("warp-tape-kernel-cache"))


KERNELS = """
@wp.kernel
def predict(w: wp.array(dtype=float), x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid(); y[i] = w[0] * x[i] + w[1]

@wp.kernel
def sq_loss(y: wp.array(dtype=float), t: wp.array(dtype=float), loss: wp.array(dtype=float)):
    i = wp.tid(); d = y[i] - t[i]; wp.atomic_add(loss, 0, d * d)

@wp.kernel
def sgd(w: wp.array(dtype=float), g: wp.array(dtype=float), rate: float):
    i = wp.tid(); w[i] = w[i] - rate * g[i]

def arr(values, grad=False):
    return wp.array(values, dtype=float, requires_grad=grad)
"""

# One tape per write: y, read by sq_loss, is overwritten before backward() by each of the
# writes the guard sees, one of them a launch recorded on the same tape. The gradient of
# the program as written is that of x and t.
KINDS = [
    "launch",
    "recorded launch",
    "launch by position",
    "recorded by position",
    "launch through inputs",
    "recorded through inputs",
    "copy",
    "assign",
    "fill_",
    "zero_",
    "numpy",
]
WRITES = (
    PREAMBLE
    + KERNELS
    + f"KINDS = {KINDS!r}"
    + """
import numpy as np
x, t, xv = arr([1.0, 2.0, 3.0]), arr([2.0, 4.0, 7.0]), arr([10.0, 20.0, 30.0])

def overwrite(kind, y, w):
    if kind == "launch":
        wp.launch(predict, 3, inputs=[w, xv], outputs=[y])  # WRITE
    elif kind == "launch by position":
        wp.launch(predict, 3, [w, xv], [y])  # WRITE
    elif kind == "launch through inputs":  # Warp's own examples' form: y in inputs
        wp.launch(predict, 3, inputs=[w, xv, y])  # WRITE
    elif kind == "copy":
        wp.copy(y, xv)  # WRITE
    elif kind == "assign":
        y.assign(xv)  # WRITE
    elif kind == "fill_":
        y.fill_(5.0)  # WRITE
    elif kind == "zero_":
        y.zero_()  # WRITE
    elif kind == "numpy":
        y.numpy()[:] = 9.0  # WRITE
    elif kind == "numpy read":
        float(y.numpy().sum())  # a view, read only

result = {}
for kind in ["none", *KINDS, "numpy read"]:
    w, y, loss = arr([1.0, 0.5], True), arr([0.0] * 3, True), arr([0.0], True)
    tape = wp.Tape()
    with capture_events() as events:
        try:
            with tape:
                wp.launch(predict, 3, inputs=[w, x], outputs=[y])
                wp.launch(sq_loss, 3, inputs=[y, t], outputs=[loss])  # READ
                if kind == "recorded launch":
                    wp.launch(predict, 3, inputs=[w, xv], outputs=[y])  # WRITE
                elif kind == "recorded by position":  # its reads and its write
                    wp.launch(predict, 3, [w, xv], [y])  # WRITE
                elif kind == "recorded through inputs":
                    wp.launch(predict, 3, inputs=[w, xv, y])  # WRITE
            overwrite(kind, y, w)
            current = y.numpy().tolist()
            tape.backward(loss)  # BACKWARD
            result[kind] = {"grad": w.grad.numpy().tolist(), "y": y.numpy().tolist(),
                            "current": current}
        except Exception as exc:
            result[kind] = {"error": f"{type(exc).__name__}: {exc}"}
    result[kind]["events"] = events
print(json.dumps(result, default=str))
"""
)
REFERENCE = [-28.0, -11.0]  # d/dw sum((w0 x + w1 - t)^2) at w = (1, 0.5), x and t above


def line(marker: str, kind: str = "") -> str:
    lines = WRITES.splitlines()
    found = [i for i, text in enumerate(lines, 1) if marker in text]
    if kind:  # the line above a write names its kind
        found = [i for i in found if f'"{kind}"' in lines[i - 2]]
    return f"repro.py:{found[0]}"


@pytest.mark.parametrize("version", VERSIONS)
def test_each_write_unguarded_gives_the_gradient_of_the_current_contents(
    tmp_path, warp_cache, version
):
    result = run(version, None, tmp_path, warp_cache, script=WRITES)
    assert result["none"]["grad"] == REFERENCE
    assert result["numpy read"]["grad"] == REFERENCE
    for kind in KINDS:
        assert result[kind]["grad"] != REFERENCE, kind  # Warp's own bug, silently


@pytest.mark.parametrize("version", VERSIONS)
def test_fix_gives_the_gradient_of_the_program_as_written(tmp_path, warp_cache, version):
    unguarded = run(version, None, tmp_path, warp_cache, script=WRITES)
    result = run(version, {"mode": "fix"}, tmp_path, warp_cache, script=WRITES)
    for kind in ["none", "numpy read"]:
        assert result[kind] == {**unguarded[kind], "events": []}, kind
    for kind in KINDS:
        fixed = result[kind]
        assert fixed["grad"] == REFERENCE, kind
        # the arrays keep their current contents: only the adjoints saw the copies
        assert fixed["y"] == fixed["current"] == unguarded[kind]["y"], kind
        [event] = fixed["events"]
        assert event["action"] == "overwritten" and "was given" in event["event"]
        [array] = event["arrays"]
        assert array["argument"] == "y" and array["kernel"] == "sq_loss"
        assert array["read_at"] == line("# READ")
        assert array["written_at"] == line("# WRITE", kind), kind
        assert event["callsite"] == line("# BACKWARD")
        assert array["shape"] == [3] and "values" not in str(event)


@pytest.mark.parametrize("version", VERSIONS)
def test_observe_names_the_write_and_strict_raises_at_backward(tmp_path, warp_cache, version):
    unguarded = run(version, None, tmp_path, warp_cache, script=WRITES)
    observed = run(version, {"mode": "observe"}, tmp_path, warp_cache, script=WRITES)
    strict = run(version, {"mode": "strict"}, tmp_path, warp_cache, script=WRITES)
    for kind in KINDS:
        assert observed[kind]["grad"] == unguarded[kind]["grad"], kind  # observed, not fixed
        [event] = observed[kind]["events"]
        assert "fix gives each launch" in event["event"]
        launched = "launch" in kind or "position" in kind or "inputs" in kind
        assert event["arrays"][0]["written_by"].startswith(
            f"wp.launch of predict ({'input' if 'inputs' in kind else 'output'} 'y')"
            if launched
            else {"numpy": "a write through"}.get(kind, "")
        )
        assert strict[kind]["error"].startswith("GuardError: autograd-guard [warp_tape]")
        assert "'y'" in strict[kind]["error"]
    assert strict["none"] == {**unguarded["none"], "events": []}


# Warp's own idioms: buffers reused after backward(), tape.zero() and tape.reset(),
# accumulation across launches with wp.atomic_add, a write then a read in one tape, a
# second tape that does not read what the first one's arrays became.
# The arrays of one small fit, made by the scripts below.
ARRAYS = """
x, t = arr([1.0, 2.0, 3.0]), arr([2.0, 4.0, 7.0])
w, y, loss = arr([1.0, 0.5], True), arr([0.0] * 3, True), arr([0.0], True)
"""
IDIOMS = (
    PREAMBLE
    + KERNELS
    + ARRAYS
    + """
history = []
with capture_events() as events:
    tape = wp.Tape()
    for step in range(5):
        loss.zero_()
        with tape:
            wp.launch(predict, 3, inputs=[w, x], outputs=[y])  # written, then read
            wp.launch(sq_loss, 3, inputs=[y, t], outputs=[loss])
            wp.launch(sq_loss, 3, inputs=[y, x], outputs=[loss])  # accumulated
        tape.backward(loss)
        wp.launch(sgd, 2, inputs=[w, w.grad, 0.01])  # reused after backward()
        wp.launch(predict, 3, inputs=[w, x], outputs=[y])
        history.append(w.numpy().tolist() + loss.numpy().tolist())
        tape.zero()
        if step % 2:
            tape.reset()
        else:
            tape = wp.Tape()
    other = wp.Tape()
    with other:
        wp.launch(predict, 3, inputs=[w, x], outputs=[y])
    wp.launch(sq_loss, 3, inputs=[y, t], outputs=[loss])  # no tape: nothing recorded
    scoped = None
    try:
        with wp.ScopedCapture(device="cpu") as capture:
            wp.launch(predict, 3, inputs=[w, x], outputs=[y])
    except Exception as exc:
        scoped = type(exc).__name__
print(json.dumps({"history": history, "y": y.numpy().tolist(), "scoped": scoped,
                  "events": events}))
"""
)


def through_inputs(script: str) -> str:
    """``script`` with every launch's outputs passed in its inputs (Warp's examples' form:
    a kernel may write any array argument)."""
    assert "], outputs=[" in script
    return script.replace("], outputs=[", ", ")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("form", ["outputs", "inputs"])
def test_warp_idioms_are_silent_and_bit_identical(tmp_path, warp_cache, version, form):
    script = IDIOMS if form == "outputs" else through_inputs(IDIOMS)
    unguarded = run(version, None, tmp_path, warp_cache, script=script)
    for mode in ("observe", "fix", "strict"):
        guarded = run(version, {"mode": mode}, tmp_path, warp_cache, script=script)
        assert guarded == {**unguarded, "events": []}, mode


# The user's shape: pure Warp, a hand-written SGD step, 60 steps; each step's validation
# pass reuses the prediction buffer before backward(). The reference is the same program
# with a fresh buffer for the validation's predictions.
FIT = (
    PREAMBLE
    + KERNELS
    + """
import numpy as np
rng = np.random.default_rng(0)
xs = rng.uniform(-1, 1, 64); x, t = arr(xs), arr(3.0 * xs - 1.0)
xv = arr(rng.uniform(-1, 1, 64))

def fit(fresh):
    w, y, loss = arr([0.0, 0.0], True), arr([0.0] * 64, True), arr([0.0], True)
    val_y, val_loss = arr([0.0] * 64), arr([0.0])
    for step in range(60):
        loss.zero_(); val_loss.zero_()
        tape = wp.Tape()
        with tape:
            wp.launch(predict, 64, inputs=[w, x], outputs=[y])
            wp.launch(sq_loss, 64, inputs=[y, t], outputs=[loss])
        out = val_y if fresh else y
        wp.launch(predict, 64, inputs=[w, xv], outputs=[out])  # validation
        wp.launch(sq_loss, 64, inputs=[out, arr(3.0 * xv.numpy() - 1.0)], outputs=[val_loss])
        tape.backward(loss)
        wp.launch(sgd, 2, inputs=[w, w.grad, 0.005])
        tape.zero()
    return w.numpy().tolist(), float(loss.numpy()[0])

with capture_events() as events:
    reused = fit(False)
reference = fit(True)
print(json.dumps({"reused": reused, "reference": reference, "events": events}))
"""
)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("form", ["outputs", "inputs"])
def test_fit_under_fix_is_the_fit_with_fresh_buffers(tmp_path, warp_cache, version, form):
    script = FIT if form == "outputs" else through_inputs(FIT)
    unguarded = run(version, None, tmp_path, warp_cache, script=script)
    (w, _), (w_ref, loss_ref) = unguarded["reused"], unguarded["reference"]
    assert w_ref == pytest.approx([3.0, -1.0], abs=0.05) and loss_ref < 0.1
    assert abs(w[0] - 3.0) > 0.5  # the reused buffer's gradient: a wrong fit, silently
    fixed = run(version, {"mode": "fix"}, tmp_path, warp_cache, script=script)
    assert fixed["reference"] == unguarded["reference"]
    assert fixed["reused"][0] == pytest.approx(w_ref, rel=1e-6, abs=1e-7)
    assert fixed["reused"][1] == pytest.approx(loss_ref, rel=1e-5, abs=1e-7)
    assert {e["action"] for e in fixed["events"]} == {"overwritten"}
    assert len(fixed["events"]) == 1  # one event per call site, not per step


# Warp records the frame that called wp.launch as each launch's caller (its tape
# visualisation names it): the guard's wrappers must not take its place, on a plain
# recorded launch, one that overwrites what an earlier one read (the guard handles it),
# and one that Warp itself launches (warp.optim's SGD step, recorded on purpose here).
CALLERS = (
    PREAMBLE
    + KERNELS
    + ARRAYS
    + """
import warp.optim

def forward(tape):
    with tape:
        wp.launch(predict, 3, inputs=[w, x], outputs=[y])
        wp.launch(sq_loss, 3, inputs=[y, t], outputs=[loss])
        wp.launch(predict, 3, inputs=[w, t], outputs=[y])  # overwrites what sq_loss read
        warp.optim.SGD([w], lr=0.0).step([w.grad])

with capture_events() as events:
    tape = wp.Tape()
    forward(tape)
    callers = [entry[-1].get("caller") if isinstance(entry, list) else None
               for entry in tape.launches]
print(json.dumps({"callers": callers}))
"""
)


@pytest.mark.parametrize("version", VERSIONS)
def test_warp_records_the_users_frame_as_each_launchs_caller(tmp_path, warp_cache, version):
    unguarded = run(version, None, tmp_path, warp_cache, script=CALLERS)["callers"]
    assert [c["func"] for c in unguarded[:3]] == ["forward"] * 3
    assert "optim" in unguarded[3]["file"]  # Warp's own launch names Warp's frame
    for mode in ("observe", "fix", "strict"):
        guarded = run(version, {"mode": mode}, tmp_path, warp_cache, script=CALLERS)
        assert guarded["callers"] == unguarded, mode


# A tape kept across steps (reset each step) must not keep what its earlier steps read,
# nor the guard's copies of it, alive: unguarded, each step's arrays are freed.
KEPT_TAPE = (
    PREAMBLE
    + KERNELS
    + """
import gc, weakref
tape, freed = wp.Tape(), []
with capture_events() as events:
    for step in range(4):
        w, x, t = arr([1.0, 0.5], True), arr([1.0, 2.0, 3.0]), arr([2.0, 4.0, 7.0])
        y, loss = arr([0.0] * 3, True), arr([0.0], True)
        with tape:
            wp.launch(predict, 3, inputs=[w, x], outputs=[y])
            wp.launch(sq_loss, 3, inputs=[y, t], outputs=[loss])
        t.fill_(0.0)  # overwritten after sq_loss read it
        try:
            tape.backward(loss)
        except Exception:
            pass
        tape.reset()
        freed.append(weakref.ref(t))
    del t
    gc.collect()
print(json.dumps({"alive": [ref() is not None for ref in freed], "events": len(events)}))
"""
)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_kept_tape_frees_what_earlier_steps_read(tmp_path, warp_cache, version):
    unguarded = run(version, None, tmp_path, warp_cache, script=KEPT_TAPE)
    assert unguarded == {"alive": [False] * 4, "events": 0}
    for mode in ("observe", "fix", "strict"):
        guarded = run(version, {"mode": mode}, tmp_path, warp_cache, script=KEPT_TAPE)
        assert guarded["alive"] == [False] * 4, mode
        assert guarded["events"] >= 1, mode


# Warp pauses a recording around its own launches by setting runtime.tape to None
# (warp.fem's array_axpy): the first launch of a recording, paused so, must not switch the
# guard off for the rest of it. Nor a tape started by hand (runtime.tape set) after a
# tape that was entered: that one is documented as unseen, the entered one is watched.
PAUSED = (
    PREAMBLE
    + KERNELS
    + ARRAYS
    + """
import threading
context = wp._src.context if hasattr(wp, "_src") else wp.context
xv, a = arr([10.0, 20.0, 30.0]), arr([1.0, 1.0, 1.0])

def on():  # the guard's switch: wp.launch's prelude, or its wrapper (wrapt's enabled)
    return bool(vars(context).get("__autograd_guard_warp_tape__")
                or getattr(wp.launch, "_self_enabled", None))
tape = wp.Tape()
with capture_events() as events:
    with tape:
        paused, context.runtime.tape = context.runtime.tape, None
        wp.launch(predict, 3, inputs=[w, x], outputs=[a])  # Warp's own, not recorded
        context.runtime.tape = paused
        wp.launch(predict, 3, inputs=[w, x], outputs=[y])
        wp.launch(sq_loss, 3, inputs=[y, t], outputs=[loss])
        switch = [on()]
    side = threading.Thread(target=lambda: wp.launch(predict, 3, inputs=[w, x], outputs=[a]))
    side.start(); side.join()  # a launch on another thread, with no tape
    wp.launch(predict, 3, inputs=[w, xv], outputs=[y])  # overwrites what sq_loss read
    tape.backward(loss)
    switch.append(on())
print(json.dumps({"grad": w.grad.numpy().tolist(), "events": [e["action"] for e in events],
                  "switch": switch}))
"""
)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_recording_paused_by_warp_and_a_launch_on_another_thread_stay_watched(
    tmp_path, warp_cache, version
):
    unguarded = run(version, None, tmp_path, warp_cache, script=PAUSED)
    assert unguarded["grad"] != REFERENCE and unguarded["events"] == []
    fixed = run(version, {"mode": "fix"}, tmp_path, warp_cache, script=PAUSED)
    # on while recording; off once backward() is done: launches then go straight to Warp
    assert fixed == {"grad": REFERENCE, "events": ["overwritten"], "switch": [True, False]}


# The guard installed while a tape records (a notebook cell, a late install()): the
# launches recorded from then on are watched, as if the tape had been entered after it.
LATE = (
    PREAMBLE.replace("    autograd_guard.install(policy)", "    pass")
    + KERNELS
    + ARRAYS
    + """
xv = arr([10.0, 20.0, 30.0])
tape = wp.Tape()
with capture_events() as events:
    with tape:
        wp.launch(predict, 3, inputs=[w, x], outputs=[y])
        if policy is not None:
            autograd_guard.install(policy)
        wp.launch(sq_loss, 3, inputs=[y, t], outputs=[loss])
    wp.launch(predict, 3, inputs=[w, xv], outputs=[y])  # overwrites what sq_loss read
    tape.backward(loss)
print(json.dumps({"grad": w.grad.numpy().tolist(), "events": [e["action"] for e in events]}))
"""
)


@pytest.mark.parametrize("version", VERSIONS)
def test_installed_while_a_tape_records_watches_the_rest_of_it(tmp_path, warp_cache, version):
    unguarded = run(version, None, tmp_path, warp_cache, script=LATE)
    assert unguarded["grad"] != REFERENCE and unguarded["events"] == []
    fixed = run(version, {"mode": "fix"}, tmp_path, warp_cache, script=LATE)
    assert fixed["grad"] == REFERENCE
    assert [e for e in fixed["events"] if e != "late_patch"] == ["overwritten"]


# wp.launch(..., record_cmd=True) runs nothing and records nothing: it returns a Launch to
# run later. Its inputs are not reads of the tape: overwriting them is not a finding, and
# a launch recorded after it keeps its own inputs.
COMMAND = (
    PREAMBLE
    + KERNELS
    + ARRAYS
    + """
xv, a = arr([10.0, 20.0, 30.0]), arr([0.0] * 3)
tape = wp.Tape()
with capture_events() as events:
    with tape:
        wp.launch(predict, 3, inputs=[w, x], outputs=[y])
        command = wp.launch(predict, 3, inputs=[w, xv], outputs=[a], record_cmd=True)
        wp.launch(sq_loss, 3, inputs=[y, t], outputs=[loss])
    xv.fill_(0.0)  # read by the command only
    tape.backward(loss)
print(json.dumps({"grad": w.grad.numpy().tolist(), "events": [e["action"] for e in events]}))
"""
)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_launch_kept_as_a_command_is_not_a_read_of_the_tape(tmp_path, warp_cache, version):
    unguarded = run(version, None, tmp_path, warp_cache, script=COMMAND)
    assert unguarded == {"grad": REFERENCE, "events": []}
    for mode in ("observe", "fix", "strict"):
        assert run(version, {"mode": mode}, tmp_path, warp_cache, script=COMMAND) == unguarded


# A backward() that raises (here: a loss of 3 elements) ran no backward: the retry is
# watched as the first call was, not given the arrays' current contents.
RETRY = (
    PREAMBLE
    + KERNELS
    + ARRAYS
    + """
xv = arr([10.0, 20.0, 30.0])
tape, errors = wp.Tape(), []
with capture_events() as events:
    with tape:
        wp.launch(predict, 3, inputs=[w, x], outputs=[y])
        wp.launch(sq_loss, 3, inputs=[y, t], outputs=[loss])
    wp.launch(predict, 3, inputs=[w, xv], outputs=[y])  # overwrites what sq_loss read
    for root in (y, loss):
        try:
            tape.backward(root)
        except Exception as exc:
            errors.append(type(exc).__name__)
print(json.dumps({"grad": w.grad.numpy().tolist(), "errors": errors,
                  "events": [e["action"] for e in events]}))
"""
)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_backward_that_raised_leaves_the_retry_watched(tmp_path, warp_cache, version):
    unguarded = run(version, None, tmp_path, warp_cache, script=RETRY)
    assert unguarded["grad"] != REFERENCE and unguarded["errors"] == ["RuntimeError"]
    fixed = run(version, {"mode": "fix"}, tmp_path, warp_cache, script=RETRY)
    assert fixed["grad"] == REFERENCE and fixed["errors"] == ["RuntimeError"]
    assert set(fixed["events"]) == {"overwritten"}
    strict = run(version, {"mode": "strict"}, tmp_path, warp_cache, script=RETRY)
    assert strict["errors"] == ["GuardError", "GuardError"]


# wp.launch carries the guard's check compiled into its own code (a prelude): no wrapper,
# no frame of the guard's between the caller and Warp; uninstall() puts Warp's code back.
PRELUDE = (
    PREAMBLE
    + KERNELS
    + ARRAYS
    + """
import traceback, types
context = wp._src.context if hasattr(wp, "_src") else wp.context
found = {"function": type(wp.launch) is types.FunctionType,
         "global": "__autograd_guard_warp_tape__" in vars(context)}
code = wp.launch.__code__
def frames():
    with wp.Tape():
        try:
            wp.launch(predict, 3, inputs=[w, x], outputs=[y], device="nowhere")
        except Exception as exc:
            return [f.name for f in traceback.extract_tb(exc.__traceback__)][:2]
found["frames"] = frames()
autograd_guard.uninstall()
found["undone"] = [wp.launch.__code__ is not code if policy else True,
                   "__autograd_guard_warp_tape__" not in vars(context)]
found["after"] = frames()
print(json.dumps(found))
"""
)


@pytest.mark.parametrize("version", VERSIONS)
def test_launch_has_a_prelude_undone_at_uninstall(tmp_path, warp_cache, version):
    unguarded = run(version, None, tmp_path, warp_cache, script=PRELUDE)
    # warp_torch_args wraps wp.launch on 1.3-1.5 (NVIDIA/warp#394): warp_tape alone here
    policy = {"mode": "fix", "disable": ["warp_torch_args"]}
    guarded = run(version, policy, tmp_path, warp_cache, script=PRELUDE)
    assert unguarded["frames"][:2] == ["frames", "launch"]
    assert guarded == {**unguarded, "global": True}


# A Launch kept with record_cmd=True and run later by cmd.launch() writes what its kernel
# writes: Warp 1.16 and newer keep its arrays (fwd_args), so the guard sees the write;
# 1.5.1 keeps only packed parameters, and the write goes unseen (documented).
REPLAY = (
    PREAMBLE
    + KERNELS
    + ARRAYS
    + """
xv = arr([10.0, 20.0, 30.0])
command = wp.launch(predict, 3, inputs=[w, xv, y], record_cmd=True)
tape = wp.Tape()
with capture_events() as events:
    with tape:
        wp.launch(predict, 3, inputs=[w, x], outputs=[y])
        wp.launch(sq_loss, 3, inputs=[y, t], outputs=[loss])
    command.launch()  # overwrites what sq_loss read
    tape.backward(loss)
print(json.dumps({"grad": w.grad.numpy().tolist(), "y": y.numpy().tolist(),
                  "events": [e["arrays"][0]["written_by"] for e in events]}))
"""
)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_commands_replay_is_seen_where_warp_keeps_its_arrays(tmp_path, warp_cache, version):
    unguarded = run(version, None, tmp_path, warp_cache, script=REPLAY)
    assert unguarded["grad"] != REFERENCE and unguarded["events"] == []
    fixed = run(version, {"mode": "fix"}, tmp_path, warp_cache, script=REPLAY)
    if version == "1.5.1":
        assert fixed == unguarded
        return
    assert fixed["grad"] == REFERENCE and fixed["y"] == unguarded["y"]
    assert fixed["events"] == ["Launch.launch() of predict (parameter 'y')"]


# With wp.launch's prelude, Tape.__enter__ is Warp's own (unwrapped): the prelude sees a
# recording through Warp's runtime.tape, however it was begun (here: set by hand).
BY_HAND = (
    PREAMBLE
    + KERNELS
    + ARRAYS
    + """
import types
context = wp._src.context if hasattr(wp, "_src") else wp.context
xv = arr([10.0, 20.0, 30.0])
tape = wp.Tape()
with capture_events() as events:
    context.runtime.tape = tape  # a recording begun without Tape.__enter__
    wp.launch(predict, 3, inputs=[w, x], outputs=[y])
    wp.launch(sq_loss, 3, inputs=[y, t], outputs=[loss])
    context.runtime.tape = None
    wp.launch(predict, 3, inputs=[w, xv], outputs=[y])  # overwrites what sq_loss read
    tape.backward(loss)
print(json.dumps({"grad": w.grad.numpy().tolist(), "events": [e["action"] for e in events],
                  "enter": type(wp.Tape.__enter__) is types.FunctionType}))
"""
)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_recording_begun_without_enter_is_watched_and_enter_is_warps_own(
    tmp_path, warp_cache, version
):
    unguarded = run(version, None, tmp_path, warp_cache, script=BY_HAND)
    assert unguarded["grad"] != REFERENCE and unguarded["events"] == []
    policy = {"mode": "fix", "disable": ["warp_torch_args"]}  # see the prelude test
    fixed = run(version, policy, tmp_path, warp_cache, script=BY_HAND)
    assert fixed == {"grad": REFERENCE, "events": ["overwritten"], "enter": True}
