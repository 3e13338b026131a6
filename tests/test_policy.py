"""Policy discovery, validation and environment overrides."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autograd_guard._common import STATE
from autograd_guard._common.cache import DiskCache
from autograd_guard._policy import files as _policy_files
from autograd_guard._policy import policy as _policy
from autograd_guard.errors import PolicyError
from autograd_guard.guards import available

GUARDS = available()


def load(source=None, environ=None, cwd=None):
    return _policy.load(source, GUARDS, environ=environ or {}, cwd=str(cwd) if cwd else None)


def test_default_preset_when_nothing_is_found(tmp_path):
    policy = load(cwd=tmp_path)
    assert policy.source == "preset default"
    assert policy.mode == "fix"
    assert policy.rules == []  # no example's rules: those are the unique3d preset's
    assert [r.target for r in load("unique3d").rules_for("enable_grad")] == [
        "mesh_reconstruction.recon:reconstruct_stage1",
        "mesh_reconstruction.refine:run_mesh_refine",
    ]


def test_search_order(tmp_path):
    project = tmp_path / "project"
    deep = project / "src" / "deep"
    deep.mkdir(parents=True)
    (project / "pyproject.toml").write_text('[tool.autograd_guard]\nmode = "observe"\n')
    assert load(cwd=deep).mode == "observe"
    assert "pyproject.toml [tool.autograd_guard]" in load(cwd=deep).source
    (tmp_path / "autograd_guard.toml").write_text('mode = "strict"\n')  # farther: loses
    assert load(cwd=deep).mode == "observe"
    (project / "autograd_guard.toml").write_text('mode = "strict"\n')  # same folder: wins
    assert load(cwd=deep).mode == "strict"
    (deep / "pyproject.toml").write_text('[project]\nname = "x"\n')  # no table: not a policy
    assert load(cwd=deep).mode == "strict"
    own = tmp_path / "own.toml"
    own.write_text('mode = "off"\n')
    assert load(environ={"AUTOGRAD_GUARD_POLICY": str(own)}, cwd=deep).mode == "off"
    assert load(environ={"AUTOGRAD_GUARD_POLICY": "observe"}, cwd=deep).source == "preset observe"


def test_nearest_pyproject_without_table_means_default(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert load(cwd=tmp_path).source == "preset default"


def test_presets(tmp_path):
    assert _policy_files.preset_names() == ["default", "observe", "strict", "unique3d"]
    strict = load("strict")
    assert strict.mode == "strict" and strict.rules == []  # extends default
    assert load("unique3d").mode == "fix"
    assert load("observe").mode_for("grad_mode") == "observe"


def test_guard_overrides_and_environment(tmp_path):
    file = tmp_path / "p.toml"
    file.write_text('mode = "fix"\n[guards.grad_mode]\nmode = "observe"\n')
    assert load(str(file)).mode_for("grad_mode") == "observe"
    assert load(str(file), {"AUTOGRAD_GUARD": "strict"}).mode_for("grad_mode") == "strict"
    assert load(str(file), {"AUTOGRAD_GUARD": "1"}).mode_for("grad_mode") == "observe"
    assert load(str(file), {"AUTOGRAD_GUARD_DISABLE": "grad_mode"}).mode_for("grad_mode") == "off"
    assert load(str(file), {"AUTOGRAD_GUARD_DISABLE": "*"}).mode_for("grad_mode") == "off"
    file.write_text("[guards.grad_mode]\nenabled = false\n")
    assert load(str(file)).mode_for("grad_mode") == "off"
    file.write_text('disable = ["grad_mode"]\n')
    assert load(str(file)).mode_for("grad_mode") == "off"


def test_user_rules_extend_the_default(tmp_path):
    file = tmp_path / "p.toml"
    file.write_text(
        'extends = "unique3d"\n[[rules]]\ntarget = "my.stages:Fit.run"\naction = "enable_grad"\n'
    )
    targets = [r.target for r in load(str(file)).rules]
    assert targets[-1] == "my.stages:Fit.run" and len(targets) == 3


@pytest.mark.parametrize(
    ("text", "key", "allowed"),
    [
        ('mode = "loud"', "mode", "'off', 'observe', 'fix', 'strict'"),
        ("mode = 3", "mode", "'off', 'observe', 'fix', 'strict'"),
        ('colour = "red"', "colour", "extends, mode, log, disable, guards, rules"),
        ('[guards.nope]\nmode = "fix"', "guards.nope", "grad_mode"),
        ('[guards.grad_mode]\nforce = "yes"', "guards.grad_mode.force", "true or false"),
        ("[guards.grad_mode]\nspeed = 1", "guards.grad_mode.speed", "enabled, mode, force"),
        ("disable = 3", "disable", "a list"),
        (
            '[[rules]]\ntarget = "no colon"\naction = "enable_grad"',
            "rules[0].target",
            "'package.module:function'",
        ),
        ('[[rules]]\ntarget = "a:b"\naction = "explode"', "rules[0].action", "'enable_grad'"),
        ('rules = "x"', "rules", "[[rules]]"),
        ('extends = "nope"', "nope", "default, observe, strict"),
    ],
)
def test_invalid_policy_names_file_key_and_allowed(tmp_path, text, key, allowed):
    file = tmp_path / "bad.toml"
    file.write_text(text + "\n")
    with pytest.raises(PolicyError) as info:
        load(str(file))
    message = str(info.value)
    assert key in message and allowed in message
    assert str(file) in message or info.value.source.startswith(str(file))


def test_broken_toml_and_unreadable_file(tmp_path):
    file = tmp_path / "bad.toml"
    file.write_text("mode = [\n")
    with pytest.raises(PolicyError, match="invalid TOML"):
        load(str(file))
    with pytest.raises(PolicyError, match="cannot read the policy file"):
        load(str(tmp_path / "missing.toml"))
    file.write_bytes(b"mode = '\xff'\n")
    with pytest.raises(PolicyError, match="not UTF-8"):
        load(str(file))


def test_invalid_environment_value():
    with pytest.raises(PolicyError, match=r"AUTOGRAD_GUARD.*allowed"):
        load(environ={"AUTOGRAD_GUARD": "loud"})


def test_extends_loop_is_an_error(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    with pytest.raises(PolicyError, match="too deep"):
        load(str(tmp_path / "a.toml"))


def test_policy_never_imports_what_it_names(tmp_path):
    import sys

    file = tmp_path / "p.toml"
    file.write_text('[[rules]]\ntarget = "never_imported_pkg.mod:f"\naction = "enable_grad"\n')
    load(str(file))
    assert "never_imported_pkg" not in sys.modules


def test_parse_cache_checks_the_bytes(tmp_path):
    cache = DiskCache(str(tmp_path / "cache"))
    file = tmp_path / "p.toml"
    cache.put(str(file), b'mode = "fix"\n', {"mode": "fix"})
    fresh = DiskCache(str(tmp_path / "cache"))  # read back from disk
    assert fresh.get(str(file), b'mode = "fix"\n') == {"mode": "fix"}
    assert fresh.get(str(file), b'mode = "strict"\n') is None  # edited file: parse again
    with open(fresh.file, "wb") as f:
        f.write(b"garbage")
    assert DiskCache(str(tmp_path / "cache")).get(str(file), b"x") is None


def test_the_cache_is_per_environment_and_distrusts_other_shapes(tmp_path, monkeypatch):
    import marshal
    import sys

    from autograd_guard._common import cache as _cache

    here = DiskCache(str(tmp_path))
    monkeypatch.setattr(sys, "prefix", "/some/other/venv")
    there = DiskCache(str(tmp_path))
    assert here.file != there.file  # two environments never evict each other's entries
    here.put("a.toml", b"x", {"mode": "fix"})
    there.put("a.toml", b"x", {"mode": "off"})
    assert DiskCache(str(tmp_path)).get("a.toml", b"x") == {"mode": "off"}
    key = str(tmp_path / "a.toml")
    with open(there.file, "wb") as f:  # another schema: ignored, not trusted
        marshal.dump({"schema": _cache.SCHEMA + 1, "entries": {key: (b"x", {})}}, f)
    assert DiskCache(str(tmp_path)).get("a.toml", b"x") is None
    with open(there.file, "wb") as f:  # the right bytes, the wrong shape
        marshal.dump({"schema": _cache.SCHEMA, "entries": {key: (b"x", ["a", "list"])}}, f)
    with open(there.file_of("plans"), "wb") as f:
        marshal.dump({"schema": _cache.SCHEMA, "entries": 3}, f)
    broken = DiskCache(str(tmp_path))
    assert broken.get(str(tmp_path / "a.toml"), b"x") is None and broken.plan("k") is None


def test_cached_and_fresh_parse_agree(tmp_path, monkeypatch):
    file = tmp_path / "p.toml"
    file.write_text('mode = "observe"\n[guards.grad_mode]\nforce = true\n')
    monkeypatch.setattr(STATE, "disk_cache", DiskCache(str(tmp_path / "c")))
    first = load(str(file))
    assert os.path.exists(DiskCache.shared().file)
    second = load(str(file))
    assert (first.mode, first.guards["grad_mode"].force) == (
        second.mode,
        second.guards["grad_mode"].force,
    )
    assert Path(second.source) == file


def test_pyproject_that_only_names_the_package_is_not_a_policy(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "autograd_guard_user"\ndependencies = ["autograd_guard"]\n'
    )
    assert load(cwd=tmp_path).source == "preset default"
    (tmp_path / "pyproject.toml").write_text(
        '[tool.autograd_guard.guards.grad_mode]\nmode = "observe"\n'
    )
    assert load(cwd=tmp_path).mode_for("grad_mode") == "observe"


# -- policy files that are not plain files ------------------------------------------------


def test_a_device_or_fifo_as_policy_is_refused_without_reading(tmp_path):
    import os

    fifo = tmp_path / "policy.fifo"
    os.mkfifo(fifo)  # opening it for reading would block until a writer comes
    for named in ("/dev/zero", str(fifo)):
        with pytest.raises(PolicyError, match=f"{named}: not a regular file"):
            load(environ={"AUTOGRAD_GUARD_POLICY": named}, cwd=tmp_path)
    (tmp_path / "autograd_guard.toml").write_text('extends = "/dev/zero"\n')
    with pytest.raises(PolicyError, match=r"extends: cannot use '/dev/zero'.*not a regular file"):
        load(cwd=tmp_path)


def test_a_policy_over_the_size_limit_is_refused(tmp_path):
    big = tmp_path / "big.toml"
    big.write_text("# padding\n" * (_policy_files.MAX_POLICY_BYTES // 10 + 1))
    with pytest.raises(PolicyError, match=r"big.toml: \d+ bytes \(allowed: at most 1048576"):
        load(str(big), cwd=tmp_path)


def test_a_dangling_policy_link_is_named(tmp_path):
    (tmp_path / "autograd_guard.toml").symlink_to(tmp_path / "gone.toml")
    with pytest.raises(PolicyError, match=r"symbolic link to .*gone.toml', which does not exist"):
        load(cwd=tmp_path)


def test_a_byte_order_mark_is_accepted(tmp_path):
    (tmp_path / "autograd_guard.toml").write_bytes(b'\xef\xbb\xbfmode = "observe"\n')
    assert load(cwd=tmp_path).mode == "observe"
    (tmp_path / "autograd_guard.toml").unlink()
    (tmp_path / "pyproject.toml").write_bytes(b'\xef\xbb\xbf[tool.autograd_guard]\nmode = "off"\n')
    assert load(cwd=tmp_path).mode == "off"


def test_the_shared_cache_follows_the_cache_folder_the_environment_names(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "first"))
    first = DiskCache.shared()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "second"))
    second = DiskCache.shared()
    assert first.folder is not None and first.folder.startswith(str(tmp_path / "first"))
    assert second.folder is not None and second.folder.startswith(str(tmp_path / "second"))
    assert DiskCache.shared() is second
