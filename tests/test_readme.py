"""The README's examples run, and its claims about start-up and the variables hold
(issue 21)."""

from __future__ import annotations

import ast
import re
import sys

import pytest
import torch
from helpers import ROOT, run_python

import autograd_guard
from autograd_guard import cli
from autograd_guard.guards import ENTRY_POINT_GROUP, builtin

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", README, flags=re.DOTALL | re.MULTILINE)


def block(language: str, containing: str) -> str:
    [found] = [text for lang, text in BLOCKS if lang == language and containing in text]
    return found


def test_the_first_block_installs_from_the_checkout():
    first = BLOCKS[0][1]
    assert "pip install autograd-guard" not in README  # not on PyPI
    assert first.startswith("python -m pip install .  ")
    wheel = "python -m pip install dist/autograd_guard-{}-py3-none-any.whl"
    assert wheel.format(autograd_guard.__version__) in README


STAGES = """
import torch

class Fitter:
    def run(self):
        w = torch.zeros(2, requires_grad=True)
        ((w - 1) ** 2).sum().backward()
        return w.grad
"""


@pytest.fixture
def my_pipeline(make_module):
    make_module("my_pipeline.stages", STAGES)
    make_module("my_pipeline.kernels", "def splat(x, out):\n    out.copy_(x)\n")


def test_the_policy_example_checks_clean_and_guards_the_stand_in(my_pipeline, tmp_path, capsys):
    policy = tmp_path / "autograd_guard.toml"
    policy.write_text(block("toml", "[[rules]]"))
    assert cli.main(["check"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and f"ok: {policy} (mode fix, 4 rules)" in captured.out
    autograd_guard.install()
    from my_pipeline.stages import Fitter

    with torch.no_grad():  # the stage needs grad: the rule gives it
        assert Fitter().run().tolist() == [-2.0, -2.0]


def test_the_python_api_example_runs():
    exec(compile(block("python", "autograd_guard.install"), "README.md", "exec"), {})


def test_the_entry_point_example_is_the_group_guards_are_read_from():
    table = tomllib.loads(block("toml", "entry-points"))["project"]["entry-points"]
    assert list(table) == [ENTRY_POINT_GROUP]


def test_the_commands_name_what_exists():
    assert (ROOT / "constraints.txt").is_file()
    assert "cd examples && AUTOGRAD_GUARD=1 python unique3d_app.py" in README
    assert (ROOT / "examples" / "unique3d_app.py").is_file()
    table = README.split("## Guards", 1)[1].split("## Policy", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE)
    assert sorted(rows) == sorted(g.name for g in builtin())


def test_a_warm_start_imports_what_the_readme_names(guard_python, project):
    code = "import sys; print(sorted(m for m in sys.modules if m.startswith('autograd_guard')))"
    run_python(guard_python, "pass", project, AUTOGRAD_GUARD="1")  # warms the caches
    loaded = eval(run_python(guard_python, code, project, AUTOGRAD_GUARD="1").stdout)
    sentence = README.split("With it set, a warm start", 1)[1].split(", and reads a", 1)[0]
    named = [n for n in re.findall(r"`(\w+)`", sentence) if n != "__init__"]
    assert "nine modules" in sentence and len(named) == 9 + 1  # and __future__
    assert sorted(loaded) == sorted(
        n if n == "autograd_guard" else f"autograd_guard.{n}" for n in named if n != "__future__"
    )


def _reads_a_variable(node: ast.AST) -> bool:
    """``os.environ.get("AUTOGRAD_GUARD...")``, ``os.environ["AUTOGRAD_GUARD..."]`` or
    ``os.getenv("AUTOGRAD_GUARD...")``."""
    if isinstance(node, ast.Call) and node.args:
        name, key = ast.unparse(node.func), node.args[0]
    elif isinstance(node, ast.Subscript):
        name, key = ast.unparse(node.value), node.slice
    else:
        return False
    reader = name in ("os.environ.get", "os.getenv", "os.environ")
    return reader and isinstance(key, ast.Constant) and str(key.value).startswith("AUTOGRAD")


def test_variables_are_read_in_the_environment_module_and_the_pth_only():
    readers = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "autograd_guard").rglob("*.py")
        if any(_reads_a_variable(node) for node in ast.walk(ast.parse(path.read_text())))
    }
    assert readers <= {"autograd_guard/_environment.py"}
    pth = (ROOT / "autograd_guard.pth").read_text()
    assert re.findall(r"AUTOGRAD_GUARD\w*", pth) == ["AUTOGRAD_GUARD"]
    assert "the `.pth` line\nrepeats its on/off test of `AUTOGRAD_GUARD`" in README
