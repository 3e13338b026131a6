"""Policy fuzzing: over 10,000 generated and mutated policies. The only outcomes allowed
are a valid policy or a PolicyError that names the file, the key and what is allowed."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autograd_guard._common import STATE
from autograd_guard._common.cache import DiskCache
from autograd_guard._policy import policy as _policy
from autograd_guard._policy import schema as _policy_schema
from autograd_guard.errors import PolicyError
from autograd_guard.guards import available

GUARDS = available()
NAMES = [g.name for g in GUARDS]
SEED_POLICY = """\
extends = "default"
mode = "fix"
log = "stderr"
disable = ["ipex_xpu"]

[guards.warp_torch_args]
action = "snapshot"
bridge_grads = true

[guards.ipex_xpu]
devices = ["xpu", "cpu"]
crosscheck_every = 10

[[rules]]
target = "my.stages:Fit.run"
action = "enable_grad"

[[rules]]
target = "my.ops:scale"
action = "snapshot"
check = "data"
outputs = ["out", 2]
max_bytes = 1048576
"""

odd_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    # No subnormals: a kernel compiled by inductor with -ffast-math (another test) flushes
    # them process-wide, and hypothesis then refuses to generate them.
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False),
    odd_text,
    st.sampled_from(
        [
            "fix",
            "observe",
            "strict",
            "off",
            "default",
            "version",
            "data",
            "convert",
            "snapshot",
            "enable_grad",
            "a.b:c",
            "*",
            "",
            "\x00",
            "é",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(odd_text, inner, max_size=4)
    ),
    max_leaves=12,
)
keys = st.one_of(
    st.sampled_from(
        [
            *_policy_schema.TOP_LEVEL_KEYS,
            *_policy_schema.GUARD_KEYS,
            *NAMES,
            "target",
            "action",
            "check",
            "outputs",
            "max_bytes",
            "devices",
            "bridge_grads",
            "redirect",
        ]
    ),
    odd_text,
)
guard_tables = st.dictionaries(
    st.sampled_from([*NAMES, "nope"]), st.dictionaries(keys, values, max_size=4), max_size=3
)
rules = st.lists(st.dictionaries(keys, values, max_size=5), max_size=3)
policies = st.fixed_dictionaries(
    {},
    optional={
        "mode": values,
        "log": values,
        "disable": values,
        "guards": st.one_of(guard_tables, values),
        "rules": st.one_of(rules, values),
        "extends": st.sampled_from(["default", "strict", "nope"]),
    },
).flatmap(lambda d: st.dictionaries(keys, values, max_size=2).map(lambda extra: {**extra, **d}))


def check(source, load) -> None:
    try:
        policy = load()
    except PolicyError as exc:
        text = str(exc)
        assert text.startswith(exc.source) and exc.source  # the file (or the variable)
        assert exc.problem
        if exc.key:
            assert exc.key in text
    else:
        for name in NAMES:
            assert policy.mode_for(name) in _policy.MODES


@pytest.fixture(autouse=True)
def _no_parse_cache(monkeypatch):
    monkeypatch.setattr(STATE, "disk_cache", DiskCache(None))


FUZZ = settings(
    max_examples=4000,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ
@given(policies)
def test_generated_policies(data):
    check("<dict>", lambda: _policy.load(data, GUARDS, environ={}))


@FUZZ
@given(
    st.lists(
        st.tuples(st.integers(0, len(SEED_POLICY)), st.integers(0, 8), odd_text),
        min_size=1,
        max_size=4,
    )
)
def test_mutated_toml(tmp_path_factory, edits):
    text = SEED_POLICY
    for position, deleted, inserted in edits:
        text = text[:position] + inserted + text[position + deleted :]
    path = tmp_path_factory.getbasetemp() / "fuzz.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    check(str(path), lambda: _policy.load(str(path), GUARDS, environ={}))


@settings(max_examples=2500, deadline=None, derandomize=True)
@given(st.binary(max_size=200), st.sampled_from(["", "1", "strict", "loud", "\x00"]))
def test_raw_bytes_and_environment(tmp_path_factory, raw, mode):
    path = tmp_path_factory.getbasetemp() / "raw.toml"
    path.write_bytes(raw)
    check(str(path), lambda: _policy.load(str(path), GUARDS, environ={"AUTOGRAD_GUARD": mode}))
