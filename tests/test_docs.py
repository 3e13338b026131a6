"""The docs site builds with ``mkdocs build --strict`` (a broken link, anchor or page fails),
its generated pages follow the code, and every snippet and command in the README and the
docs runs or names what exists."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from importlib.util import find_spec

import pytest
from helpers import ROOT

from autograd_guard import cli
from autograd_guard._common import environment as _environment
from autograd_guard._policy import schema as _policy_schema
from autograd_guard.guards import builtin

# mkdocs-material needs Python 3.11 or newer: on 3.10 (the oldest cells) the test extra
# leaves both out and only the build and the hooks are skipped; every other check runs.
NEEDS_MKDOCS = "the docs need the test extra's mkdocs and mkdocs-material (Python >= 3.11)"


def need_mkdocs() -> None:
    pytest.importorskip("mkdocs", reason=NEEDS_MKDOCS)
    pytest.importorskip("material", reason=NEEDS_MKDOCS)


FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)
PAGES = sorted((ROOT / "docs").glob("*.md"))
TEXTS = [ROOT / "README.md", *PAGES]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    need_mkdocs()
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    return out


def _text(page) -> str:
    return " ".join(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")).split())


def test_every_guard_has_a_page_generated_from_its_module(site):
    for guard in builtin():
        page = _text(site / "guards" / guard.name / "index.html")
        assert guard.name in page and f"Generated from {guard.__module__}" in page
        for option in guard.options:
            assert option in page
    index = _text(site / "guards" / "index.html")
    assert all(guard.name in index for guard in builtin())


def test_the_configuration_page_lists_every_key_and_variable(site):
    page = _text(site / "configuration" / "index.html")
    keys = (*_policy_schema.TOP_LEVEL_KEYS, *_policy_schema.GUARD_KEYS, *_environment.VARIABLES)
    assert all(key in page for key in keys)
    assert "generated:" not in page  # every marker was filled


def test_the_changelog_and_matrix_are_included(site):
    assert "Unreleased" in _text(site / "changelog" / "index.html")
    assert "3.10 + 2.1.2" in _text(site / "contributing" / "index.html")


def test_a_guard_that_fails_to_import_fails_the_build(monkeypatch):
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import hooks
    finally:
        sys.path.remove(str(ROOT / "docs"))
    import autograd_guard.guards as guards

    monkeypatch.setattr(guards, "BUILTIN", (*guards.BUILTIN, "no_such_guard"))
    with pytest.raises(ModuleNotFoundError, match="no_such_guard"):
        hooks.on_config({"nav": [{"Guards": []}]})


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: p.name)
def test_python_snippets_run(path):
    for language, code in FENCE.findall(path.read_text(encoding="utf-8")):
        if language == "python":
            exec(compile(code, str(path), "exec"), {})


def _commands(path) -> list[tuple[object, list[str]]]:
    """(working folder, words) of each command in the ``sh`` blocks; a ``cd`` holds for the
    rest of its line."""
    found = []
    for language, body in FENCE.findall(path.read_text(encoding="utf-8")):
        if language != "sh":
            continue
        for line in body.splitlines():
            folder = ROOT
            for command in re.split(r"&&|\(|\)", line.split("  #")[0]):
                words = [w for w in shlex.split(command) if "=" not in w or w[0] == "-"]
                if words[:1] == ["cd"]:
                    folder = folder / words[1]
                    assert folder.is_dir(), line
                elif words:
                    found.append((folder, words))
    return found


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: p.name)
def test_commands_name_what_exists(path):
    commands = _commands(path)
    assert commands or path.name not in ("README.md", "getting-started.md")
    for folder, (program, *rest) in commands:
        if program in ("python", "python3") and rest[:1] == ["-m"]:
            assert find_spec(rest[1]) is not None, rest
        elif program == ".":  # a venv made on the same line is activated
            assert rest == [".venv/bin/activate"], rest
        elif program == "python":
            assert (folder / rest[0]).is_file(), rest
        elif program == "autograd-guard":
            assert rest[0] in cli.COMMANDS or rest[0].startswith("-"), rest
        else:
            assert program in ("rm", "mkdocs", "nox"), program


def _strict_stop_bullet() -> str:
    text = " ".join((ROOT / "docs" / "configuration.md").read_text(encoding="utf-8").split())
    return text.split("**Strict asked for:**", 1)[1].split("The headline names", 1)[0]


def _run(python, *args: str, cwd, **env: str) -> subprocess.CompletedProcess[str]:
    from wheelenv import clean_environ

    return subprocess.run(
        [str(python), *args],
        cwd=cwd,
        env=clean_environ(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_strict_stop_the_docs_describe_is_what_the_code_does(guard_python, tmp_path):
    """docs/configuration.md: with strict asked for and an invalid setting, a program stops
    at its import of torch with the status the docs name, one headline and one line per
    problem, no traceback; pip and the autograd-guard command run on."""
    from autograd_guard._policy import failure as _policy_failure

    claim = _strict_stop_bullet()
    assert "imports torch stops at that import" in claim and "no traceback" in claim
    assert f"exit status {_policy_failure.STOP_STATUS}," in claim
    assert "Programs that never import torch (`pip`," in claim
    torch = _run(guard_python, "-c", "import torch", cwd=tmp_path, AUTOGRAD_GUARD="stirct")
    assert (torch.returncode, torch.stdout) == (_policy_failure.STOP_STATUS, "")
    headline, *problems = torch.stderr.splitlines()
    assert headline.startswith("autograd-guard: invalid AUTOGRAD_GUARD value in strict mode")
    assert len(problems) == 1 and "Traceback" not in torch.stderr
    pip = _run(guard_python, "-m", "pip", "--version", cwd=tmp_path, AUTOGRAD_GUARD="stirct")
    assert (pip.returncode, pip.stderr) == (0, "") and pip.stdout.startswith("pip ")
    check = _run(
        guard_python, "-m", "autograd_guard.cli", "check", cwd=tmp_path, AUTOGRAD_GUARD="stirct"
    )
    assert "(`autograd-guard check` names the problems)" in claim and check.returncode == 1
    assert check.stderr.startswith("invalid setting: AUTOGRAD_GUARD: invalid value 'stirct'")


def test_presets_are_listed_from_the_shipped_files(site):
    """policies/*.toml is the list: the extends row and the presets table are generated
    from it, and no page lists some presets by hand (unique3d was missing)."""
    from autograd_guard._policy import files as _policy_files

    names = _policy_files.preset_names()
    page = _text(site / "configuration" / "index.html")
    assert f"a preset name ({', '.join(names)})" in page
    assert all(f"{name} {_policy_files.preset_summary(name)[:20]}" in page for name in names)
    listed = re.compile(r"`(\w+)`(?:,?\s+(?:or\s+|and\s+)?`(\w+)`)+")
    only_presets = set(names) - set(_environment.MODES)  # default, unique3d
    for path in TEXTS:
        for found in listed.finditer(path.read_text(encoding="utf-8")):
            words = set(re.findall(r"`(\w+)`", found.group(0)))
            if words & only_presets and words <= set(names):
                assert set(names) <= words, (path.name, found.group(0))


def _calls(name: str) -> set[str]:
    """The functions of the package whose body calls ``name`` (``x.name()`` or ``name()``)."""
    import ast

    found = set()
    for path in (ROOT / "autograd_guard").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                called = {
                    ast.unparse(c.func).rpartition(".")[2]
                    for c in ast.walk(node)
                    if isinstance(c, ast.Call)
                }
                if name in called and node.name != name:
                    found.add(node.name)
    return found


def test_the_exit_statuses_the_docs_name_are_the_codes():
    """Only a lost gradient (or a step without any) found at exit, or strict's skipped
    non-finite step with no step after it, sets status 3 (not
    zero_gradient or unattached_rules); an unusable policy where strict was asked for is 2."""
    import inspect

    from autograd_guard._policy import failure as _policy_failure
    from autograd_guard.guards.grad_health import findings as _grad_findings
    from autograd_guard.guards.grad_health import usage as _grad_usage

    section = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    section = " ".join(section.split("## Exit statuses", 1)[1].split("\n## ", 1)[0].split())
    rows = dict(re.findall(r"\| (\d) \| ([^|]*) \|", section))
    assert rows[str(_policy_failure.STOP_STATUS)].startswith("strict was asked for")
    assert rows[str(_grad_findings.EXIT_STATUS)].startswith(
        "`strict`: a `lost_gradient` or `no_gradient` found"
    )
    assert _calls("fail_at_exit") == {"strict_finding"}
    # and strict's stop deferred to name the op, where no step came after it (issue 52)
    assert _calls("strict_finding") == {"_lost_event", "_report_no_gradient", "_say"}
    assert "a non-finite step skipped with no step after it" in rows["3"]
    assert 'action="lost_gradient"' in inspect.getsource(_grad_usage.Usage._lost_event)
    assert 'action="no_gradient"' in inspect.getsource(_grad_usage.Usage._report_no_gradient)
    for finding in ("zero_gradient", "nonfinite_origin", "unattached_rules", "unused_parameter"):
        assert f"`{finding}`" in section.split("leaves the status as it is", 1)[1]
    for path in TEXTS:  # the old claim: "a finding at exit: status 3"
        assert "a finding at exit" not in " ".join(path.read_text(encoding="utf-8").split())


def test_grad_health_page_names_the_finding_correct_training_can_log():
    """A converged hinge loss (exactly zero) logs zero_gradient after zero_steps steps."""
    from autograd_guard.guards.grad_health import GUARD

    intro = " ".join((ROOT / "docs" / "grad-health.md").read_text(encoding="utf-8").split())
    intro = intro.split("## ", 1)[0]
    default = GUARD.options["zero_steps"].default
    assert f"after `zero_steps` ({default}) such steps" in intro and "hinge" in intro
    assert "`zero_steps = 0`" in intro and "Correct training logs nothing, with one" in intro


def _hooks():
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import hooks
    finally:
        sys.path.remove(str(ROOT / "docs"))
    return hooks


def test_the_site_publishes_no_bytecode_and_is_ignored_by_git(site):
    assert not [p for p in site.rglob("*") if "__pycache__" in p.parts or p.suffix == ".pyc"]
    assert "/site/" in (ROOT / ".gitignore").read_text().splitlines()


def test_each_page_is_once_in_the_nav(site):
    """grad_health has its guide in the nav; its generated page is linked, not listed again."""
    page = (site / "index.html").read_text(encoding="utf-8")
    nav = page.split('class="md-nav md-nav--primary"', 1)[1].split('class="md-content"', 1)[0]
    titles = re.findall(r'<span class="md-ellipsis">\s*(.*?)\s*</span>', nav, flags=re.S)
    pages = [t for t in titles if t != "Guards"]  # the section and its index page
    assert len(pages) == len(set(pages)) and "grad_health" in pages
    assert all(guard.name in pages for guard in builtin())
    assert 'href="../guards/grad_health/"' in (site / "grad-health" / "index.html").read_text()


def test_long_lines_wrap_and_identifiers_stay_whole(site):
    """Event lines (up to ~1,200 characters) wrap inside their code blocks with room for
    the copy button; table cells break identifiers only at spaces."""
    css = (site / "stylesheets" / "extra.css").read_text()
    assert 'href="../stylesheets/extra.css"' in (site / "usage" / "index.html").read_text()
    code_block = css.split(".md-typeset pre > code {", 1)[1].split("}", 1)[0]
    assert "white-space: pre-wrap" in code_block and "padding-right" in code_block
    table_code = css.split(".md-typeset table:not([class]) code {", 1)[1].split("}", 1)[0]
    assert "word-break: normal" in table_code and "overflow-wrap: normal" in table_code


def test_every_link_of_the_site_leads_somewhere(site, tmp_path):
    import shutil

    from check_site_links import broken_links

    broken, read = broken_links(site)
    assert broken == [] and read > 500
    copy = tmp_path / "site"
    shutil.copytree(site, copy)
    page = copy / "usage" / "index.html"
    page.write_text(page.read_text().replace('href="../configuration/', 'href="../no-such/', 1))
    assert broken_links(copy)[0] == ["usage/index.html: ../no-such/ (no such file)"]


def test_the_files_read_whole_as_they_are_on_github():
    """docs/*.md hold their generated sections (python docs/hooks.py writes them) and link
    only to files that exist: the site turns the links to modules into its pages."""
    hooks = _hooks()
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        assert hooks.fill(text, path.name) == text, f"{path.name}: run python docs/hooks.py"
        for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not link.startswith(("http://", "https://")):
                assert (path.parent / link).exists(), f"{path.name}: {link}"
    assert "<!-- generated: policy-keys -->\n| key | value |" in doc_text("configuration.md")
    page = hooks.site_links("[a](../autograd_guard/guards/) [b](../CHANGELOG.md)", "x")
    assert page == "[a](guards/index.md) [b](changelog.md)"
    page = hooks.site_links("[c](../autograd_guard/guards/grad_health/)", "x")
    assert page == "[c](guards/grad_health.md)"


def doc_text(name: str) -> str:
    return (ROOT / "docs" / name).read_text(encoding="utf-8")


def test_performance_gives_grad_health_s_step_cost_once():
    """The table's step row is within the range the text gives for the code as it is
    (the idle runs), not a loaded run's."""
    text = doc_text("performance.md")
    [row] = [line for line in text.splitlines() if "CPU: step guarded vs bare" in line]
    ratio = float(re.search(r"([\d.]+)x\s+<=", row).group(1))
    now = re.search(r"now (\d\.\d+)-(\d\.\d+)x", " ".join(text.split()))
    assert now is not None
    assert float(now.group(1)) <= ratio <= float(now.group(2))
