"""grad_health in real 2-rank jobs: torchrun, gloo, CPU, the guard started by the wheel's
``.pth``. Select them with ``pytest tests/test_grad_health_distributed.py`` or ``-m
distributed``.

Each run is ``torch.distributed.run --standalone --nproc_per_node 2
tests/distributed/worker.py SCENARIO VARIANT OUTDIR`` (its docstring says what the
scenarios and variants do); a run that does not end within ``TIMEOUT`` is killed and fails
its test (a hang). A NaN gets in at step ``NAN_STEP``. The contract, per scenario:

- ``handfix`` (the hand-written rank-consistent skip) is the reference: ``fix`` ends
  bit-identical to it on every rank (weights and optimizer state), with one
  ``nonfinite_gradient`` event for the whole job, logged by rank 0, naming the parameter
  by its user name and the ranks that had the NaN;
- ``strict`` raises ``GuardError`` on every rank at the same step, no rank having stepped;
- ``observe`` is ``plain``, bit for bit;
- a plain DDP model decides without the guard's exchange (``replicas``): its scenario
  whose NaN gets in after DDP's all-reduce, on one rank, runs with ``exchange_ddp = true``
  (the variants ending in ``-exchange``), the setting for such programs;
- unguarded, the NaN does the harm the scenario is about (replicas drift apart, the
  weights are poisoned), which the ``plain`` runs show.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch
import wheelenv

pytestmark = pytest.mark.distributed

WORKER = Path(__file__).resolve().parent / "distributed" / "worker.py"
TIMEOUT = 240  # seconds for one torchrun job; a run takes ~6 s alone, 4 ranks ~20 s
NAN_STEP = 3  # the worker's
GUARDED = ("observe", "fix", "strict")
DDP, SPREAD, SOME_RANKS = "ddp_nan_one_rank", "ddp_nan_spread", "some_ranks_step"
ZERO_OWN, ZERO_OTHER = "zero_own_shard", "zero_other_shard"
FSDP1, FSDP2 = "fsdp1_shard_nan", "fsdp2_nan"
PIPE_FIRST, PIPE_LAST = "pipeline_nan_first_stage", "pipeline_nan_last_stage"
TP, MESH = "tp_nan_one_slice", "mesh_2x2_nan_one_rank"
CATCHES, RAISES, DCP = "ddp_rank_catches_its_error", "ddp_rank_raises", "dcp_resume_after_skip"
JOIN = "ddp_join_uneven"
SINGULAR = "ddp_singular_point"
RANKS = {MESH: 4}  # processes per job; 2 for the others
# the ranks whose gradient gets the NaN (SPREAD, ZERO_OWN: DDP's all-reduce and ZeRO's
# broadcast spread it to every rank)
POISONED = {SPREAD: [0, 1], PIPE_FIRST: [0], MESH: [3], SOME_RANKS: [0]}
WRAPPER_NAMES = ("_flat_param", "_fsdp_wrapped_module")


def fsdp2_missing() -> str | None:
    """Why FSDP2 cannot run in this torch, or None."""
    for name in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if not hasattr(module, "fully_shard"):
            continue
        if not hasattr(torch.cpu.Stream, "record_event"):  # torch 2.4-2.6
            return (
                f"FSDP2 cannot run on CPU in torch {torch.__version__}: its all-gather calls "
                "torch.cpu.Stream.record_event, which this torch does not have"
            )
        return None
    return f"FSDP2 (fully_shard) is not in torch {torch.__version__}"


def fsdp1_on_cpu_missing() -> str | None:
    """Why FSDP1 cannot run on CPU in this torch, or None: its lazy init makes its streams
    with ``device_handle.Stream(priority=...)``, which torch 2.1's ``torch.cpu.Stream``
    does not take (``device_id=None`` asks for CUDA instead)."""
    try:
        torch.cpu.Stream(priority=0)
    except TypeError as exc:
        return (
            f"FSDP1 cannot run on CPU in torch {torch.__version__}: its first forward calls "
            f"torch.cpu.Stream(priority=0), which raises TypeError: {exc}"
        )
    return None


def missing(module: str, what: str) -> str | None:
    """Why ``what`` cannot run in this torch (``module`` is not in it), or None."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return f"{what} is not in torch {torch.__version__} ({module}: {exc})"
    return None


def pipeline_missing() -> str | None:
    """Why a 2-stage GPipe job cannot run on CPU and gloo in this torch, or None. torch
    2.9's stages abort in gloo's point-to-point (``Received data size doesn't match
    expected size. 8 vs 4``, SIGABRT) unguarded too: seen with 2.9.1, where 2.6 and 2.13 run
    the same job."""
    from packaging.version import Version

    if Version(torch.__version__).release[:2] == (2, 9):
        return (
            f"torch {torch.__version__}'s pipelining aborts on CPU and gloo, unguarded too "
            "(gloo: Received data size doesn't match expected size. 8 vs 4)"
        )
    return missing("torch.distributed.pipelining", "torch.distributed.pipelining")


def tp_missing() -> str | None:
    """Tensor parallelism over a DeviceMesh made by ``init_device_mesh`` (torch 2.2+)."""
    return missing("torch.distributed.device_mesh", "init_device_mesh (a CPU DeviceMesh)")


def mesh_missing() -> str | None:
    """A 2-D mesh: FSDP2 over its data-parallel dimension, tensor parallel over the other."""
    return tp_missing() or fsdp2_missing()


def dcp_missing() -> str | None:
    return missing("torch.distributed.checkpoint.state_dict", "get_state_dict/set_state_dict")


def when(scenario: str, why: str | None) -> object:
    return pytest.param(scenario, marks=pytest.mark.skipif(why is not None, reason=str(why)))


def scenario_params() -> list[object]:
    return [
        DDP,
        SPREAD,
        ZERO_OWN,
        ZERO_OTHER,
        when(FSDP1, fsdp1_on_cpu_missing()),
        when(FSDP2, fsdp2_missing()),
        SOME_RANKS,
        when(PIPE_FIRST, pipeline_missing()),
        when(PIPE_LAST, pipeline_missing()),
        when(TP, tp_missing()),
        when(MESH, mesh_missing()),
    ]


SCENARIOS = scenario_params()


def guarded(scenario: str, mode: str) -> str:
    """The variant of ``mode`` for ``scenario``: DDP's NaN comes after its all-reduce, on
    rank 1 alone, which only ``exchange_ddp = true`` decides together."""
    return f"{mode}-exchange" if scenario == DDP else mode


# where a NaN reaches a consumed gradient (ZeRO's other shard: a gradient nobody reads)
SKIPPING = [s for s in SCENARIOS if s != ZERO_OTHER]


class Run:
    """One finished job: each rank's record (the worker's ``rank{N}.pt``) and the
    grad_health events of the JSON log."""

    def __init__(self, outdir: Path, output: str, nranks: int = 2) -> None:
        self.output = output
        self.ranks = [torch.load(outdir / f"rank{r}.pt", weights_only=True) for r in range(nranks)]
        self.events = read_events(outdir)

    def nonfinite(self) -> list[dict[str, object]]:
        return self.action("nonfinite_gradient")

    def action(self, action: str) -> list[dict[str, object]]:
        return [e for e in self.events if e["action"] == action]


def read_events(outdir: Path) -> list[dict[str, object]]:
    log = outdir / "events.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return [json.loads(line) for line in lines]


def descendants(pid: int) -> list[int]:
    """The processes started, directly or not, by ``pid`` (torchrun's workers run in
    sessions of their own, out of reach of its process group)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [c for c, p in parents.items() if p in frontier]
        found += children
        frontier = children
    return found


def launch(python: Path, scenario: str, variant: str, outdir: Path) -> Run | str:
    """Run one job; a Run, or why it failed."""
    env = wheelenv.clean_environ(OMP_NUM_THREADS="1")
    mode, _, exchange = variant.partition("-")  # "fix-exchange": exchange_ddp = true
    if mode in GUARDED:
        env.update(AUTOGRAD_GUARD=mode, AUTOGRAD_GUARD_LOG=str(outdir / "events.jsonl"))
    if exchange:
        (outdir / "autograd_guard.toml").write_text("[guards.grad_health]\nexchange_ddp = true\n")
    nranks = RANKS.get(scenario, 2)
    command = [
        str(python),
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nranks),
        str(WORKER),
        scenario,
        variant,
        str(outdir),
    ]
    with subprocess.Popen(
        command,
        cwd=outdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for pid in [proc.pid, *descendants(proc.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            output, _ = proc.communicate()
            return f"{scenario}/{variant} hung, killed after {TIMEOUT} s:\n{output[-6000:]}"
    if proc.returncode != 0:
        return f"{scenario}/{variant} exited {proc.returncode}:\n{output[-6000:]}"
    return Run(outdir, output, nranks)


@pytest.fixture(scope="module")
def job(guard_python: Path, tmp_path_factory: pytest.TempPathFactory):
    """``job(scenario, variant)``: the finished Run, each launched once per module (in
    sequence: the machine has 2 cores)."""
    runs: dict[tuple[str, str], Run | str] = {}

    def run(scenario: str, variant: str) -> Run:
        key = (scenario, variant)
        if key not in runs:
            outdir = tmp_path_factory.mktemp(f"{scenario}-{variant}")
            runs[key] = launch(guard_python, scenario, variant, outdir)
        result = runs[key]
        if isinstance(result, str):
            pytest.fail(result, pytrace=False)
        return result

    return run


# -- comparing ---------------------------------------------------------------------------


def differences(a: object, b: object, where: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ: tensors bit for bit (NaN included), the rest by ==."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return [f"{where}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"]
        if torch.equal(bits(a), bits(b)):
            return []
        return [f"{where}: {a.flatten()[:6].tolist()} != {b.flatten()[:6].tolist()}"]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(a, key=str)} != {sorted(b, key=str)}"]
        return [d for k in a for d in differences(a[k], b[k], f"{where}[{k!r}]")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items != {len(b)}"]
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def assert_same(a: object, b: object, what: str) -> None:
    diffs = differences(a, b)
    assert not diffs, f"{what} differ in {len(diffs)} places: " + "; ".join(diffs[:4])


def assert_ranks_equal(a: Run, b: Run, what: str, key: str = "final") -> None:
    """Every rank of ``a`` ends as the same rank of ``b`` (weights and optimizer state)."""
    assert len(a.ranks) == len(b.ranks)
    for rank in range(len(a.ranks)):
        assert_same(a.ranks[rank][key], b.ranks[rank][key], f"rank {rank}: {what}")


def finite(state: dict[str, list[torch.Tensor]], key: str = "weights") -> bool:
    return all(bool(torch.isfinite(w).all()) for w in state[key])


def skipped(run: Run) -> list[list[str]]:
    return [r["happened"] for r in run.ranks]


def poisoned_name(plain: Run) -> str:
    """The user name of the parameter the NaN went into (all of them: ``0.weight``)."""
    names = [r["poisoned"] for r in plain.ranks if r["poisoned"] is not None]
    return names[0] if names else "0.weight"


def user_name(name: str, wanted: str) -> bool:
    """``name`` is ``wanted``, also under DDP's ``module.`` prefix."""
    return name == wanted or name == f"module.{wanted}"


# -- unguarded: the harm, and the hand-written skip that avoids it ---------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_unguarded_runs_show_the_harm_and_the_handwritten_skip_avoids_it(job, scenario):
    plain, handfix = job(scenario, "plain"), job(scenario, "handfix")
    after_nan = [r["history"][NAN_STEP] for r in plain.ranks]
    if scenario == ZERO_OTHER:  # a gradient no optimizer reads: harmless, nothing skipped
        assert_ranks_equal(plain, job(scenario, "clean"), "plain and the run without a NaN")
        assert_ranks_equal(handfix, plain, "handfix and plain")
        assert skipped(handfix) == [[], []]
        return
    if scenario == SOME_RANKS:  # rank 0's local optimizer; the DDP model is not touched
        assert not finite(after_nan[0], "local_weights")
        assert skipped(handfix) == [[f"skipped local step {NAN_STEP}"], []]
        for rank in handfix.ranks:
            assert finite(rank["final"]) and finite(rank["final"], "local_weights")
        assert_same(*(r["final"]["weights"] for r in handfix.ranks), "the DDP replicas")
        assert_same(
            handfix.ranks[1]["final"]["local_weights"],
            handfix.ranks[1]["history"][0]["local_weights"],
            "rank 1's local weights, never stepped,",
        )
        return
    poisoned = [0, 1] if scenario == ZERO_OWN else POISONED.get(scenario, [1])
    for rank, state in enumerate(after_nan):  # the other ranks' parts step on, finite
        assert finite(state) == (rank not in poisoned), f"rank {rank} after the NaN"
    if scenario == DDP:  # rank 1's copy alone is poisoned: the replicas drift apart
        assert differences(after_nan[0]["weights"], after_nan[1]["weights"])
    assert skipped(handfix) == [[f"skipped step {NAN_STEP}"]] * len(handfix.ranks)
    for rank in handfix.ranks:
        assert finite(rank["final"])
    if scenario in (DDP, SPREAD, ZERO_OWN):  # replicated weights stay replicated
        assert_same(*(r["final"]["weights"] for r in handfix.ranks), "the replicas")


# -- guarded ------------------------------------------------------------------------------


def assert_no_guard_error(run: Run) -> None:
    """The guard did not fail (the localiser, say, on a DTensor), and every event carries
    its rank (the worker passes it to ``init_process_group``: no ``RANK`` variable)."""
    assert run.action("guard_error") == [], run.action("guard_error")
    assert all("rank" in e for e in run.events), [e for e in run.events if "rank" not in e]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_fix_ends_as_the_handwritten_skip_with_one_event(job, scenario):
    fixed, handfix = job(scenario, guarded(scenario, "fix")), job(scenario, "handfix")
    assert skipped(fixed) == [[]] * len(fixed.ranks), "fix raised"
    assert_ranks_equal(fixed, handfix, "fix and handfix")
    assert_no_guard_error(fixed)
    events = fixed.nonfinite()
    if scenario == ZERO_OTHER:
        assert events == [], "no optimizer reads the non-finite gradient"
        return
    assert len(events) == 1, f"one nonfinite_gradient event per job: {events}"
    (event,) = events
    assert str(event.get("rank")) == "0", f"logged by the group's first rank: {event}"
    names = event.get("parameters") or []
    wanted = poisoned_name(job(scenario, "plain"))
    assert any(user_name(n, wanted) for n in names), f"{wanted} not named: {names}"
    assert not [n for n in names if any(w in n for w in WRAPPER_NAMES)], names
    if scenario == SOME_RANKS:  # a local optimizer: rank 0's decision alone
        assert event.get("ranks", [0]) == [0], event
    else:
        assert event.get("ranks") == POISONED.get(scenario, [1]), event
    summaries = fixed.action("steps_skipped")  # at exit, after destroy_process_group()
    stepped_alone = [0] if scenario == SOME_RANKS else list(range(len(fixed.ranks)))
    assert sorted(e["rank"] for e in summaries) == stepped_alone, summaries


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_strict_raises_on_every_rank_before_any_steps(job, scenario):
    strict = job(scenario, guarded(scenario, "strict"))
    if scenario == ZERO_OTHER:  # nothing non-finite is consumed: nothing to refuse
        assert skipped(strict) == [[], []]
        assert_ranks_equal(strict, job(scenario, "plain"), "strict and plain")
        assert strict.nonfinite() == []
        return
    handfix = job(scenario, "handfix")
    if scenario == SOME_RANKS:  # rank 0's local step is skipped, its next one refused
        assert_local_stop(strict, handfix)
        return
    nranks = len(strict.ranks)
    assert skipped(strict) == [[f"raised at step {NAN_STEP}"]] * nranks, "not every rank raised"
    assert [e["rank"] for e in strict.nonfinite()] == [0], "logged once, by the first rank"
    for rank in range(nranks):
        assert_same(
            strict.ranks[rank]["final"],
            handfix.ranks[rank]["history"][NAN_STEP - 1],
            f"rank {rank}: strict after its refusal and handfix before step {NAN_STEP}",
        )


def assert_local_stop(strict: Run, handfix: Run) -> None:
    """A rank's local optimizer in strict: its non-finite step is skipped as by hand, the
    raise comes at that optimizer's next step (weights unchanged) and the shared
    optimizer's steps run as unguarded on every rank (no rank stops where its code, or
    another rank, does not expect it)."""
    assert skipped(strict) == [[f"local raised at step {NAN_STEP + 1}"], []]
    for rank in range(len(strict.ranks)):
        pairs = zip(strict.ranks[rank]["history"], handfix.ranks[rank]["history"], strict=True)
        for step, (ours, hand) in enumerate(pairs):
            for key in ("weights", "optimizer"):
                assert_same(ours[key], hand[key], f"rank {rank} step {step}: shared {key}")
    history = strict.ranks[0]["history"]
    for key in ("local_weights", "local_optimizer"):
        hand = handfix.ranks[0]["history"][NAN_STEP][key]
        assert_same(history[NAN_STEP][key], hand, f"{key} after the skipped step")
        assert_same(history[NAN_STEP + 1][key], hand, f"{key} after the refused step")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_observe_changes_nothing(job, scenario):
    observed, plain = job(scenario, guarded(scenario, "observe")), job(scenario, "plain")
    assert skipped(observed) == [[]] * len(observed.ranks)
    assert_no_guard_error(observed)
    for rank in range(len(observed.ranks)):
        assert_same(
            observed.ranks[rank]["history"],
            plain.ranks[rank]["history"],
            f"rank {rank}: observe and plain, step by step",
        )


# -- ranks out of step, a rank gone, a checkpoint after a skip ------------------------------


def assert_each_rank_as_unguarded(plain: Run, fixed: Run) -> list[dict[str, object]]:
    """``fixed`` ends as ``plain`` on each rank, bit for bit, step by step, no step
    waiting (``ONE_STEP``); each rank said once that it decides alone: those events."""
    for rank in (0, 1):
        assert_same(fixed.ranks[rank]["history"], plain.ranks[rank]["history"], f"rank {rank}: fix")
        slowest = max(fixed.ranks[rank]["seconds"])
        assert slowest < ONE_STEP, f"rank {rank} waited {slowest:.1f} s in a step"
    notices = fixed.action("ranks_out_of_step")
    assert sorted(e["rank"] for e in notices) == [0, 1], notices
    return notices


def assert_alone_as_unguarded(
    plain: Run, fixed: Run, happened: list[list[str]], step: int, failed: tuple[int, ...] = ()
) -> None:
    """``fixed`` ends as ``plain`` on each rank, bit for bit, step by step, no step waiting
    (``ONE_STEP``), no skip, no guard error but on the ranks ``failed``: each rank said
    once that it decides alone from then on, rank 1 having left its step ``step`` with no
    word."""
    assert skipped(plain) == skipped(fixed) == happened
    errors = fixed.action("guard_error")
    assert sorted(e["rank"] for e in errors) == list(failed), errors
    assert all("rank" in e for e in fixed.events), [e for e in fixed.events if "rank" not in e]
    notices = assert_each_rank_as_unguarded(plain, fixed)
    said = f"rank 0 at its step {step}, rank 1 began a forward pass before its step {step}'s check"
    assert all(said in e["event"] for e in notices), notices
    assert fixed.nonfinite() == []


def test_a_rank_that_catches_its_own_error_runs_as_unguarded(job):
    """Rank 1 skips step 3 by its own code (it raises before ``step()`` and catches it;
    no NaN anywhere): its next forward tells rank 0 at once (``skips``; no
    ``exchange_timeout`` to wait), each rank says so once and decides alone from then on;
    both ranks end as the unguarded job does, bit for bit, step by step, no step
    waiting."""
    plain, fixed = job(CATCHES, "plain"), job(CATCHES, "fix-exchange")
    caught = [[], [f"caught its error at step {NAN_STEP}"]]
    assert_alone_as_unguarded(plain, fixed, caught, NAN_STEP + 1)


def test_a_rank_that_raises_uncaught_ends_the_job_as_unguarded(guard_python, tmp_path):
    """Rank 1 raises before step 3: the job fails as it does unguarded, within the
    timeout (no hang), with rank 1's error, and the guard fails nothing of its own."""
    for variant in ("plain", "fix"):
        outdir = tmp_path / variant
        outdir.mkdir()
        result = launch(guard_python, RAISES, variant, outdir)
        assert isinstance(result, str), f"{variant}: the job did not fail"
        assert "hung" not in result.splitlines()[0], result
        assert "out of memory (raised by the test before step())" in result, result
        assert not [e for e in read_events(outdir) if e["action"] == "guard_error"]


def exchanging(scenario: str) -> str:
    """The guarded variant that exchanges at ``scenario``'s steps (plain DDP: with
    ``exchange_ddp = true``; ``test_plain_ddp_...`` below runs it without)."""
    return "fix-exchange" if scenario.startswith(f"{DDP}+") else "fix"


# each parallelism where the guard exchanges: rank 1's step pre-hook raises at NAN_STEP
HOOKED = [
    DDP,
    when(FSDP2, fsdp2_missing()),
    when(TP, tp_missing()),
    when(PIPE_LAST, pipeline_missing()),
]
ONE_STEP = 20.0  # seconds: a step of these jobs takes well under 1 s; the guard's wait, 60


@pytest.mark.parametrize("scenario", HOOKED)
def test_a_rank_whose_step_pre_hook_raises_and_is_caught_runs_as_unguarded(job, scenario):
    """Rank 1's optimizer step pre-hook raises at step 3 (an OOM guard), before the
    guard's check; its loop catches it and goes on. The step's way out tells rank 0 at
    once (its wait was 60 s, and DDP's next all-reduce timed out on rank 1 behind it):
    each rank decides alone from then on, said once with each rank's step; both end as
    the unguarded job does, bit for bit, step by step, no step waiting."""
    scenario += "+hook_catch"
    plain, fixed = job(scenario, "plain"), job(scenario, exchanging(scenario))
    caught = [[], [f"caught its error at step {NAN_STEP}"]]
    assert_alone_as_unguarded(plain, fixed, caught, NAN_STEP + 1)


def test_a_step_pre_hook_that_raises_at_the_first_shared_step_runs_as_unguarded(job):
    """Rank 1's step pre-hook raises at its very first step, before the guard has ever
    checked its optimizer (whether it is shared is not known yet): its step, watched
    from the optimizer's making, still tells rank 0 at once."""
    scenario = f"{DDP}+first_hook_catch"
    plain, fixed = job(scenario, "plain"), job(scenario, "fix-exchange")
    assert_alone_as_unguarded(plain, fixed, [[], ["caught its error at step 0"]], 1)


def test_a_check_that_fails_open_before_the_exchange_runs_as_unguarded(job):
    """The guard's own check raises on rank 1 at step 3, before its exchange: it fails
    open (a guard_error event, the step runs), and the step's end tells rank 0 at once."""
    scenario = f"{DDP}+check_fails"
    plain, fixed = job(scenario, "plain"), job(scenario, "fix-exchange")
    assert_alone_as_unguarded(plain, fixed, [[], []], NAN_STEP + 1, failed=(1,))


@pytest.mark.parametrize("scenario", HOOKED)
def test_a_rank_whose_step_pre_hook_raises_uncaught_ends_the_job_as_unguarded(
    guard_python, tmp_path, scenario
):
    """The same error, not caught: the job fails as it does unguarded (rank 1 raised;
    torchrun's exit status), within the timeout (no hang), and the guard fails nothing of
    its own."""
    ends = []
    for variant in ("plain", "fix"):
        outdir = tmp_path / variant
        outdir.mkdir()
        result = launch(guard_python, f"{scenario}+hook_raise", variant, outdir)
        assert isinstance(result, str), f"{variant}: the job did not fail"
        first = result.splitlines()[0]
        assert "hung" not in first, result
        ends.append(first.split(" exited ")[1])
        assert (outdir / "raised").read_text() == f"rank 1 raised at step {NAN_STEP}\n"
        assert not [e for e in read_events(outdir) if e["action"] == "guard_error"]
    assert ends[0] == ends[1], f"unguarded {ends[0]}, guarded {ends[1]}"


# each parallelism where the guard exchanges (rank 1: the pipeline's last stage, which
# receives before its module's forward)
LOOP_SKIPS = [
    DDP,
    when(FSDP2, fsdp2_missing()),
    when(TP, tp_missing()),
    when(PIPE_LAST, pipeline_missing()),
]


@pytest.mark.parametrize("scenario", LOOP_SKIPS)
def test_a_step_that_one_rank_skips_after_backward_runs_as_unguarded(job, scenario):
    """Rank 1's loop skips step 3 after its backward (``if bad: continue``); rank 0
    steps. Unguarded both finish (the model's collectives are in its forward and
    backward). Guarded, rank 0 waited in the guard's exchange of that step while rank 1
    was in its next forward: now rank 1's next forward (a pipeline schedule's next
    ``step``) posts "no step here" first, each
    rank decides alone from then on, said once with each rank's step, and both end as
    the unguarded job does, bit for bit, step by step, no step waiting."""
    scenario += "+skip"
    plain, fixed = job(scenario, "plain"), job(scenario, exchanging(scenario))
    assert_alone_as_unguarded(plain, fixed, [[], [f"skipped step {NAN_STEP}"]], NAN_STEP + 1)


# plain DDP, with no exchange_ddp: each way rank 1 leaves a step, its last step's too
PLAIN_DDP_EXITS = [
    CATCHES,
    f"{DDP}+hook_catch",
    f"{DDP}+first_hook_catch",
    f"{DDP}+last_hook_catch",
    f"{DDP}+skip",
    f"{DDP}+check_fails",
    f"{DDP}+skip_all_eval_one",  # every rank skips, then rank 0 alone runs without grad
    "ddp_accumulates_no_sync+hook_catch",  # the first of two passes under no_sync()
]


@pytest.mark.parametrize("scenario", PLAIN_DDP_EXITS)
def test_plain_ddp_decides_without_the_exchange_whatever_step_a_rank_leaves(job, scenario):
    """A plain DDP model's ranks decide each step on their own gradients, which DDP's
    all-reduce made the same (``replicas``): nothing is exchanged, so rank 1 leaving a
    step (an error before ``step()`` or in a step pre-hook, caught; at the first step,
    at the last one with no forward after it, where the exchange kept rank 0 waiting its
    timeout; its loop skipping after backward; the guard's check failing open) keeps no
    rank waiting. Both ranks end as the unguarded job does, bit for bit, step by step,
    and the guard says nothing but its own failure."""
    plain, fixed = job(scenario, "plain"), job(scenario, "fix")
    failed = [1] if scenario.endswith("+check_fails") else []
    assert skipped(fixed) == skipped(plain)
    assert failed or skipped(plain)[1], "rank 1 left no step"

    for rank in (0, 1):
        assert_same(fixed.ranks[rank]["history"], plain.ranks[rank]["history"], f"rank {rank}")
        slowest = max(fixed.ranks[rank]["seconds"])
        assert slowest < ONE_STEP, f"rank {rank} waited {slowest:.1f} s in a step"
    assert sorted(e["rank"] for e in fixed.action("guard_error")) == failed
    said = {"guard_error", "summary"} if failed else set()  # the exit summary counts it
    assert [e for e in fixed.events if e["action"] not in said] == [], fixed.events


def test_a_gradient_changed_on_one_rank_after_ddps_all_reduce_is_that_ranks_alone(job):
    """Outside DDP's contract (its replicas drift apart, unguarded too): a NaN put into
    rank 1's gradient after the all-reduce. By default that rank skips the step alone, as
    torch's GradScaler and a hand-written local check do; rank 0, whose gradients are
    finite, steps and says nothing. ``exchange_ddp = true`` decides it together (the
    tests above)."""
    fixed, plain = job(DDP, "fix"), job(DDP, "plain")
    history = [rank["history"] for rank in fixed.ranks]
    assert_same(history[0][NAN_STEP], plain.ranks[0]["history"][NAN_STEP], "rank 0 stepped")
    assert_same(history[1][NAN_STEP]["weights"], history[1][NAN_STEP - 1]["weights"], "rank 1")
    assert finite(fixed.ranks[1]["final"])
    assert fixed.nonfinite() == [], "rank 0 found nothing: the group's voice says nothing"
    summaries = fixed.action("steps_skipped")
    assert [e["rank"] for e in summaries] == [1], summaries


def test_a_forward_without_grad_on_one_rank_changes_no_decision(job):
    """Rank 0 alone runs the DDP model without grad (logging, a metric) between backward
    and step, where rank 1's input NaN reached every rank: each rank still decides on its
    own (DDP's ``no_sync`` flag is read at forward passes with grad only), both skip, as
    the hand-written skip does, with one event and no step waiting."""
    scenario = f"{SPREAD}+eval_one"
    fixed, handfix = job(scenario, "fix"), job(scenario, "handfix")
    assert_ranks_equal(fixed, handfix, "fix and handfix", key="history")
    assert skipped(handfix) == [[f"skipped step {NAN_STEP}"]] * 2
    (event,) = fixed.nonfinite()
    assert event["rank"] == 0 and event["ranks"] == [0, 1], event
    assert fixed.action("ranks_out_of_step") == [], "the ranks chose alike"
    assert_no_guard_error(fixed)
    for rank in fixed.ranks:
        assert max(rank["seconds"]) < ONE_STEP


def test_a_hook_that_reduces_over_another_group_is_exchanged(job):
    """torch's own ``allreduce_hook`` given a group of each rank alone as its state: DDP
    leaves the gradients apart, so the step is exchanged, and rank 1's NaN skips it on
    every rank, as the hand-written skip does, named once with rank 1."""
    fixed, handfix = job("ddp_hook_own_group", "fix"), job("ddp_hook_own_group", "handfix")
    assert skipped(handfix) == [[f"skipped step {NAN_STEP}"]] * 2
    assert_ranks_equal(fixed, handfix, "fix and handfix", key="history")
    (event,) = fixed.nonfinite()
    assert event["rank"] == 0 and event["ranks"] == [1], event


def test_a_step_after_no_sync_is_each_ranks_own(job):
    """Local SGD: every backward under ``no_sync()``, so each rank steps on its own
    gradients. Rank 1's input NaN is rank 1's alone: it skips the step and says so
    itself; rank 0 steps as unguarded. Nothing is exchanged."""
    fixed, plain = job("ddp_local_steps", "fix"), job("ddp_local_steps", "plain")
    assert_same(fixed.ranks[0]["history"], plain.ranks[0]["history"], "rank 0")
    history = fixed.ranks[1]["history"]
    assert_same(history[NAN_STEP], history[NAN_STEP - 1], "rank 1 did not step")
    assert finite(fixed.ranks[1]["final"]) and not finite(plain.ranks[1]["final"])
    (event,) = fixed.nonfinite()
    assert event["rank"] == 1, event
    assert fixed.action("ranks_out_of_step") == []


@pytest.mark.parametrize("scenario", ["ddp_accumulates", "ddp_accumulates_no_sync"])
def test_gradient_accumulation_on_every_rank_stays_in_step(job, scenario):
    """Two forward and backward passes per step on every rank (the first under
    ``no_sync()``, or both synchronised): no event, the unguarded job's weights."""
    plain, fixed = job(scenario, "clean"), job(scenario, "fix")
    assert fixed.events == [], fixed.events
    for rank in (0, 1):
        assert_same(fixed.ranks[rank]["history"], plain.ranks[rank]["history"], f"rank {rank}")


@pytest.mark.skipif(dcp_missing() is not None, reason=str(dcp_missing()))
def test_a_checkpoint_right_after_a_skipped_first_step_resumes(job):
    """``torch.distributed.checkpoint`` after a first step skipped on every rank: the
    skip drops the gradients, so the save initialises the optimizer's state as the
    fresh optimizer's load does; the run resumes as the hand-written skip that calls
    ``zero_grad()``, bit for bit."""
    fixed, handfix = job(DCP, "fix"), job(DCP, "handfix")
    assert skipped(handfix) == [["skipped step 0"]] * 2
    assert_ranks_equal(fixed, handfix, "fix and handfix", key="history")
    assert len(fixed.nonfinite()) == 1


def test_ranks_that_decide_together_never_repair(job):
    """An op at its singular point makes the NaN at every step on every rank: one process
    repairs it from its fourth step (below); ranks that decide together skip every step,
    as the hand-written skip does, bit for bit, and never say they repaired."""
    fixed, handfix = job(SINGULAR, "fix"), job(SINGULAR, "handfix")
    steps = len(handfix.ranks[0]["history"])
    assert skipped(handfix) == [[f"skipped step {s}" for s in range(steps)]] * 2
    assert_ranks_equal(fixed, handfix, "fix and handfix", key="history")
    assert fixed.action("nonfinite_repaired") == []
    assert len(fixed.nonfinite()) == 1 and fixed.nonfinite()[0]["rank"] == 0
    assert_no_guard_error(fixed)


def test_one_process_repairs_the_same_singular_point():
    """The distributed test above can fail: the same model, loss and steps in one process
    are repaired (the weights move, finite), which the ranks must not do."""
    import importlib.util

    import autograd_guard
    from autograd_guard.testing import capture_events

    spec = importlib.util.spec_from_file_location("grad_health_worker", WORKER)
    assert spec is not None and spec.loader is not None
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    autograd_guard.install({})
    model = worker.make_model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = worker.adam(model.parameters())
    with capture_events() as events:
        for step in range(worker.SINGULAR_STEPS):
            opt.zero_grad()
            worker.singular_loss(
                model(worker.batch(step, 0)[0]), worker.batch(step, 0)[1]
            ).backward()
            opt.step()
    autograd_guard.uninstall()
    assert [e for e in events if e["action"] == "nonfinite_repaired"]
    moved = [not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)]
    assert any(moved) and all(torch.isfinite(p).all() for p in model.parameters())


def test_the_guards_channel_lets_a_destroyed_process_group_go():
    """After ``destroy_process_group()`` the guard holds nothing of the old group (its
    sockets, its store and the store's port are the user's to re-initialise), and the
    old channel decides no more: a re-initialised job gets a new one."""
    import gc
    import weakref

    import torch.distributed as dist

    from autograd_guard.guards.grad_health.channel import channel_for

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        old = weakref.ref(dist.distributed_c10d._get_default_group())
        channel = channel_for(dist, [0], 60.0)
        assert channel_for(dist, [0], 60.0) is channel
    finally:
        dist.destroy_process_group()
    gc.collect()
    assert old() is None, "the guard kept the destroyed default group alive"
    assert channel.closed is not None


def test_the_guards_wait_is_at_most_half_the_process_groups_timeout():
    """The user's own collectives never time out behind the guard's exchange: the wait is
    half the shortest timeout of the groups the model uses (a default group of 42 s, a
    subgroup of 7 s), and a channel found again by an optimizer whose groups are shorter
    waits that less."""
    from datetime import timedelta

    import torch.distributed as dist

    from autograd_guard.guards.grad_health.channel import channel_for
    from autograd_guard.guards.grad_health.dist import group_timeout

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group in this process")
    store = dist.HashStore()
    dist.init_process_group(
        "gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=42)
    )
    try:
        if group_timeout(dist, None) is None:
            pytest.skip(f"torch {torch.__version__} does not say its group's timeout")
        assert group_timeout(dist, None) == 42.0
        sub = dist.new_group([0], timeout=timedelta(seconds=7))
        assert group_timeout(dist, sub) == 7.0
        assert channel_for(dist, [0], 21.0).timeout == timedelta(seconds=21)
        assert channel_for(dist, [0], 3.5).timeout == timedelta(seconds=3.5)
        assert channel_for(dist, [0], 21.0).timeout == timedelta(seconds=3.5)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("variant", ["fix", "fix-exchange"])
def test_a_join_with_uneven_inputs_runs_as_unguarded(job, variant):
    """DDP under ``Join`` over a subgroup with a 10 s timeout, rank 1 one batch short:
    rank 1 shadows the model's collectives, never the guard's exchange. No step waits,
    and both ranks end as the unguarded job does, bit for bit. Plain DDP exchanges
    nothing and says nothing; with ``exchange_ddp = true`` the ranks decide alone in a
    Join, said once, as a note."""
    plain, fixed = job(JOIN, "plain"), job(JOIN, variant)
    assert_no_guard_error(fixed)
    if variant == "fix":
        for rank in (0, 1):
            assert_same(fixed.ranks[rank]["history"], plain.ranks[rank]["history"], f"{rank}")
        assert fixed.events == [], fixed.events
        return
    notes = assert_each_rank_as_unguarded(plain, fixed)
    assert all(e["level"] == "info" and "Join" in e["event"] for e in notes), notes


def test_plain_ddp_is_told_from_what_exchanges():
    """Which DDP steps are decided without the exchange (``replicas``): a DDP module over
    the model's ranks whose last forward set up a synchronised backward, with torch's own
    hooks; not one under ``no_sync()`` or without grad, one with a parameter of the
    optimizer it does not hold, one that ignores parameters, nor one with a
    communication hook that may leave the ranks' gradients apart (post-local SGD, one of
    the user's)."""
    import gc

    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    from autograd_guard.guards.grad_health.replicas import replicas_of

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = DistributedDataParallel(torch.nn.Linear(3, 2))

        def eager(fn):
            return fn

        model = DistributedDataParallel(torch.nn.Linear(3, 2))
        same = replicas_of(dist, [model, model], [0], eager)
        assert same is not None and same.plain() and same.synced()
        assert replicas_of(dist, [model, None], [0], eager) is None  # one DDP does not hold
        assert replicas_of(dist, [model], [0, 1], eager) is None  # not the model's ranks
        x = torch.randn(4, 3)
        with model.no_sync():
            model(x).sum().backward()
        assert same.plain() and not same.synced()  # each rank's own gradients
        model(x).sum().backward()
        assert same.synced()
        with torch.no_grad():  # no backward set up: read as nothing (one rank alone, say)
            model(x)
        assert same.synced()
        with model.no_sync():
            model(x).sum().backward()
            with torch.no_grad():
                model(x)
        assert not same.synced()

        def users_hook(state, bucket):  # may change the gradient on one rank
            return default_hooks.allreduce_hook(state, bucket)

        hooked = DistributedDataParallel(torch.nn.Linear(3, 2))
        hooked.register_comm_hook(None, default_hooks.fp16_compress_hook)
        # torch 2.1 keeps no hook's state (its group): only built-in hooks are trusted
        trusted = replicas_of(dist, [hooked], [0], eager) is not None
        assert trusted == hasattr(hooked, "_comm_hooks")
        custom = DistributedDataParallel(torch.nn.Linear(3, 2))
        custom.register_comm_hook(None, users_hook)
        assert replicas_of(dist, [custom], [0], eager) is None
        users_hook.__qualname__ = "allreduce_hook"  # the tutorials' name, the user's code
        named = DistributedDataParallel(torch.nn.Linear(3, 2))
        named.register_comm_hook(None, users_hook)
        assert replicas_of(dist, [named], [0], eager) is None

        gone = DistributedDataParallel(torch.nn.Linear(3, 2))  # wrapped again, then freed
        freed = replicas_of(dist, [gone], [0], eager)
        assert freed is not None and freed.synced()
        del gone
        gc.collect()
        assert freed.plain() and not freed.synced(), "never exchanged: each rank its own"

        late = DistributedDataParallel(torch.nn.Linear(3, 2))  # a hook after the first step
        first = replicas_of(dist, [late], [0], eager)
        assert first is not None and first.plain()
        late.register_comm_hook(None, users_hook)
        assert not first.plain()
        late(x).sum().backward()
        assert not first.plain(), "an unknown hook: exchanged from then on"
        first.remove()
        assert not late._forward_hooks, "its forward hook is undone"

        inner = torch.nn.Linear(3, 2)
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(inner, ["bias"])
        assert replicas_of(dist, [DistributedDataParallel(inner)], [0], eager) is None
        assert replicas_of(dist, [inner], [0], eager) is None  # not a DDP module
    finally:
        dist.destroy_process_group()
