"""warp_tape's prelude (a check compiled into a library function's own code) on a module
of our own: it runs first, adds no frame, keeps the file and line numbers, and is undone;
where the source does not give back the loaded code, nothing is changed."""

from __future__ import annotations

import importlib
import sys
import traceback

import pytest

from autograd_guard.guards.warp_tape import prelude

SOURCE = '''"""A library."""
import os
from os import path


def launch(kernel, inputs=(), outputs=(), adjoint=False):
    """Launch."""
    if kernel == "raise":
        raise ValueError(os.sep + path.sep)
    return kernel, list(inputs), outputs, sys_frame()


def sys_frame():
    import sys

    return sys._getframe(2).f_code.co_name
'''
CALL = "inputs = HOOK[0](kernel, inputs)"


@pytest.fixture
def library(tmp_path, monkeypatch):
    (tmp_path / "prelude_library.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("prelude_library")
    yield module
    sys.modules.pop("prelude_library", None)


def test_the_prelude_runs_first_in_the_functions_own_frame_and_is_undone(library):
    hook: list = []
    original = library.launch.__code__
    assert prelude.install(library.launch, "HOOK", hook, CALL) is original
    assert library.launch.__code__ is not original and library.HOOK is hook

    def user():
        return library.launch("k", [1])

    assert user() == ("k", [1], (), "user")  # off: as before
    hook.append(lambda kernel, inputs: [*inputs, kernel])
    assert user() == ("k", [1, "k"], (), "user")  # the caller is still the user's frame
    with pytest.raises(ValueError) as raised:
        library.launch("raise")
    [frame] = [f for f in traceback.extract_tb(raised.tb) if f.name == "launch"]
    assert frame.lineno == 9 and frame.filename == library.__file__  # Warp's own line
    assert prelude.install(library.launch, "HOOK", [], CALL) is None  # one per name
    prelude.undo(library.launch, original, "HOOK")
    assert library.launch.__code__ is original and not hasattr(library, "HOOK")
    assert user() == ("k", [1], (), "user")


def test_a_source_that_does_not_give_back_the_loaded_code_changes_nothing(library, tmp_path):
    original = library.launch.__code__
    (tmp_path / "prelude_library.py").write_text(SOURCE.replace("return kernel,", "return 0,"))
    import linecache

    linecache.checkcache(library.__file__)
    assert prelude.install(library.launch, "HOOK", [], CALL) is None
    assert library.launch.__code__ is original and not hasattr(library, "HOOK")


def test_a_statement_that_adds_a_local_changes_nothing(library):
    original = library.launch.__code__
    assert prelude.install(library.launch, "HOOK", [], "extra = HOOK[0](kernel)") is None
    assert library.launch.__code__ is original and not hasattr(library, "HOOK")


def test_a_condition_on_the_module_s_globals_and_a_hook_of_its_own_name(library):
    """warp_tape's form: the statement runs while the switch (a list) is on or a module
    global says so, and calls a hook held under a name of its own; undo removes both."""
    switch: list = []
    seen = []
    original = library.launch.__code__
    condition = "SWITCH or adjoint and os.sep is not None"
    hook = {"HOOKED": lambda kernel, inputs: seen.append(kernel) or inputs}
    assert (
        prelude.install(
            library.launch, "SWITCH", switch, "inputs = HOOKED(kernel, inputs)", condition, hook
        )
        is original
    )
    library.launch("off")
    library.launch("by the condition", adjoint=True)
    switch.append(True)
    library.launch("by the switch")
    assert seen == ["by the condition", "by the switch"]
    prelude.undo(library.launch, original, "SWITCH", ("HOOKED",))
    assert not hasattr(library, "SWITCH") and not hasattr(library, "HOOKED")
    assert library.launch.__code__ is original
