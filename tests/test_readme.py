"""The README's examples run and show what the program really prints; the claims the docs
make about start-up and the variables hold (issue 21). The docs' own snippets and commands:
tests/test_docs.py."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, run_python

import autograd_guard
from autograd_guard import cli
from autograd_guard.guards import ENTRY_POINT_GROUP

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

README = (ROOT / "README.md").read_text(encoding="utf-8")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)


def blocks(text: str) -> list[tuple[str, str]]:
    return FENCE.findall(text)


def block(text: str, language: str, containing: str) -> str:
    [found] = [body for lang, body in blocks(text) if lang == language and containing in body]
    return found


def doc(name: str) -> str:
    return (ROOT / "docs" / name).read_text(encoding="utf-8")


def test_the_readme_is_short_and_installs_from_the_checkout():
    assert len(README.splitlines()) <= 160
    venv, install = blocks(README)[0][1].splitlines()  # the environment, then the install
    assert "pip install autograd-guard" not in README  # not on PyPI
    assert venv.startswith("python3 -m venv .venv && . .venv/bin/activate  ")
    assert install.startswith("python -m pip install -c constraints.txt . torch  ")
    wheel = "python -m pip install dist/autograd_guard-{}-py3-none-any.whl"
    assert wheel.format(autograd_guard.__version__) in README


def test_the_two_commands_run_in_one_shell_in_order_and_ci_runs_the_second():
    section = README.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    main_job, tests = block(section, "sh", "pip install").strip().splitlines()
    # from the repository root: the policy beside the script is found from there
    assert main_job.endswith("&& AUTOGRAD_GUARD=1 python examples/unique3d_app.py")
    assert "&& AUTOGRAD_GUARD=1 python examples/nan_gradient.py &&" in main_job  # a loop first
    assert "cd " not in main_job and "constraints.txt" in tests
    assert (ROOT / "examples" / "unique3d_app.py").is_file()
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()


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


@pytest.mark.parametrize(
    ("text", "rules"),
    [(README, "1"), (doc("configuration.md"), r"\d+"), (doc("getting-started.md"), "1")],
)
def test_the_policy_examples_check_clean_and_guard_the_stand_in(
    text, rules, my_pipeline, tmp_path, capsys
):
    policy = tmp_path / "autograd_guard.toml"
    policy.write_text(block(text, "toml", "[[rules]]"))
    assert cli.main(["check"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert re.search(rf"ok: {re.escape(str(policy))} \(mode fix, {rules} rules?\)", captured.out)
    autograd_guard.install()
    from my_pipeline.stages import Fitter

    with torch.no_grad():  # the stage needs grad: the rule gives it
        assert Fitter().run().tolist() == [-2.0, -2.0]


def _shown_output(text: str, script: str) -> str:
    """What a page shows a run print: the text block after the command's own block, or
    after the command itself in one block (``$ COMMAND``)."""
    command = f"AUTOGRAD_GUARD=1 python examples/{script}\n"
    if f"$ {command}" in text:
        return text.split(f"$ {command}", 1)[1].split("```", 1)[0]
    return text.split(command, 1)[1].split("```text\n", 1)[1].split("```", 1)[0]


def _events(output: str) -> list[tuple[str, str]]:
    """(guard/action, call site) of each event line, paths relative to the checkout."""
    output = output.replace(f"{ROOT}/", "")
    return re.findall(
        r"^autograd-guard \w+: \[([\w/]+)\] .*?(?: at (\S+:\d+) \|.*)?$", output, re.M
    )


@pytest.mark.parametrize("script", ["nan_gradient.py", "detached_layer.py"])
@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_quick_start_shows_what_the_examples_print(page, script, tmp_path):
    shown = _shown_output((ROOT / page).read_text(encoding="utf-8"), script)
    run = subprocess.run(
        [sys.executable, f"examples/{script}"],
        cwd=ROOT,
        env={**_child_environ(tmp_path), "AUTOGRAD_GUARD": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert _events(run.stderr) == _events(shown) != []
    said = ("autograd-guard", "    ")  # an event's first line, and its indented lines
    printed = [line for line in shown.splitlines() if not line.startswith(said)]
    assert run.stdout.splitlines() == printed
    # every line of every event as printed, full paths shortened as the page says
    stderr = run.stderr.replace(f"{ROOT}/", "").splitlines()
    assert stderr == [line for line in shown.splitlines() if line.startswith(said)]


def _child_environ(tmp_path):
    from wheelenv import clean_environ

    return {**clean_environ(), "XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_the_entry_point_example_is_the_group_guards_are_read_from():
    table = tomllib.loads(block(doc("writing-guards.md"), "toml", "entry-points"))
    assert list(table["project"]["entry-points"]) == [ENTRY_POINT_GROUP]


def test_a_warm_start_imports_what_the_docs_name(guard_python, project):
    code = "import sys; print(sorted(m for m in sys.modules if m.startswith('autograd_guard')))"
    run_python(guard_python, "pass", project, AUTOGRAD_GUARD="1")  # warms the caches
    loaded = eval(run_python(guard_python, code, project, AUTOGRAD_GUARD="1").stdout)
    text = " ".join(doc("internals.md").split())
    sentence = text.split("With it set, a warm start", 1)[1].split(" None of them", 1)[0]
    named = [n for n in re.findall(r"`(\w+)`", sentence) if n != "__init__"]
    assert "three modules" in sentence and len(named) == 3
    assert sorted(loaded) == sorted(
        n if n == "autograd_guard" else f"autograd_guard.{n}" for n in named
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
    assert readers <= {"autograd_guard/_common/environment.py"}
    pth = (ROOT / "autograd_guard.pth").read_text()
    assert re.findall(r"AUTOGRAD_GUARD\w*", pth) == ["AUTOGRAD_GUARD"]
    assert "the `.pth` line\nrepeats its on/off test of `AUTOGRAD_GUARD`" in doc("configuration.md")


def test_uninstalling_names_the_cache_folder_the_package_uses(tmp_path):
    from autograd_guard._common import environment as _environment

    home = str(tmp_path)
    default = _environment.cache_folder({"HOME": home})
    assert default == f"{home}/.cache/autograd-guard"
    assert _environment.cache_folder({"XDG_CACHE_HOME": home}) == f"{home}/autograd-guard"
    command = block(README.split("## Uninstalling", 1)[1], "sh", "rm -rf")
    assert command.strip() == 'rm -rf "${XDG_CACHE_HOME:-$HOME/.cache}/autograd-guard"'


def test_the_documentation_link_says_how_to_build_the_docs():
    """docs/*.md hold markers where the site's tables go, and no guard pages: the
    Documentation URL leads to the README's section that says how to serve the site, and
    the guards are linked as their modules."""
    from importlib.util import find_spec

    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Documentation"].endswith("#documentation") and "## Documentation\n" in README
    section = README.split("## Documentation\n", 1)[1]
    assert "`python -m mkdocs serve`" in section
    # the test extra brings MkDocs where mkdocs-material runs (Python >= 3.11)
    assert find_spec("mkdocs") is not None or sys.version_info < (3, 11)
    assert "mkdocs-material" in section and "(autograd_guard/guards/)" in section
    linked = re.findall(r"\]\((docs/[\w./-]+?)(?:#[\w-]+)?\)", README)
    assert linked and all((ROOT / path).is_file() for path in linked)
    assert "guards/" not in " ".join(linked)  # generated pages, no files


def test_help_package_and_readme_describe_the_project_alike(capsys):
    """``--help``, the package's metadata and the README's first line say "PyTorch
    programs" alike; and the README's modes table names strict's exit statuses as usage does."""
    from autograd_guard import cli

    with pytest.raises(SystemExit):
        cli.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    description = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    assert "keeps gradients correct in PyTorch programs" in help_text
    assert description == "A run-time guard that keeps gradients correct in PyTorch programs."
    assert README.startswith("# autograd-guard\n\nA run-time guard for PyTorch programs.")
    statuses = re.findall(r"^\| (\d) \|", doc("usage.md").split("## Exit statuses", 1)[1], re.M)
    strict = next(line for line in README.splitlines() if line.startswith("| `strict` |"))
    assert f"(docs/usage.md#exit-statuses): {', '.join(statuses)} |" in strict
