"""Run one case once in a child interpreter (unguarded, by hand fixed, or guarded in a mode)
and collect what it did: exit status, output, the exception it ended with and its chain,
the files it wrote, the events the guard logged and every warning it issued (each time,
as under ``-W always``: once-per-location filtering hides no difference)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import wheelenv
from twin_cases import Case

SUPPORT = Path(__file__).resolve().parent / "support"
TESTS = SUPPORT.parent.parent
CHILD_TIMEOUT = 300

# The child's __main__: runs case.main() and records the exception it ends with (its type
# and the types along __cause__/__context__), then lets it end the program as usual.
LAUNCHER = """\
def _describe(exc, depth=0):
    if exc is None or depth > 8:
        return None
    kind = type(exc)
    return {
        "type": f"{kind.__module__}.{kind.__qualname__}",
        "code": repr(exc.code) if isinstance(exc, SystemExit) else None,
        "cause": _describe(exc.__cause__, depth + 1),
        "context": None if exc.__suppress_context__ else _describe(exc.__context__, depth + 1),
    }


def _record_warnings():
    # Every warning, each time it is issued ("-W always"), appended to TWIN_WARNINGS as
    # it comes (exit handlers and forked workers included), then shown as usual.
    import json
    import os
    import warnings

    path, show = os.environ["TWIN_WARNINGS"], warnings.showwarning
    HIDDEN = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)

    def record(message, category, filename, lineno, file=None, line=None):
        kind = f"{category.__module__}.{category.__qualname__}"
        # What Python's default filters ignore outside __main__ (this launcher).
        hidden = issubclass(category, HIDDEN) and filename != __file__
        try:
            with open(path, "a") as f:
                f.write(json.dumps([kind, str(message), filename, lineno, hidden]) + "\\n")
        except Exception:  # the interpreter's last moments: nothing left to write with
            pass
        show(message, category, filename, lineno, file, line)

    warnings.showwarning = record
    warnings.simplefilter("always")


if __name__ == "__main__":
    _record_warnings()
    try:
        import case

        case.main()
    except BaseException as exc:
        import json
        import os

        with open(os.environ["TWIN_OUTCOME"], "w") as f:
            json.dump(_describe(exc), f)
        raise
"""


@dataclass
class Outcome:
    variant: str
    folder: Path
    returncode: int
    stdout: str
    stderr: str
    exception: dict[str, Any] | None
    files: dict[str, bytes]
    events: list[dict[str, Any]]
    seconds: float
    warnings: list[Warned] = field(default_factory=list)


@dataclass(frozen=True, order=True)
class Warned:
    """One warning as issued: its category, message and the location it names (the
    program's own files as ``<case>/...``, addresses in its text as ``0x?``), and whether
    Python's default filters ignore its kind there (DeprecationWarning outside
    ``__main__`` and its kin)."""

    category: str
    message: str
    filename: str
    lineno: int
    hidden_by_default: bool = False

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}: {self.category}: {self.message}"


def run(case: Case, variant: str, python: Path, root: Path, extra_paths: list[str]) -> Outcome:
    """Run ``case`` as ``variant``: ``plain``, ``handfix`` or a guard mode."""
    folder = root / case.name / variant
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    before = _write_sources(case, folder)
    log, outcome = folder.with_suffix(".events.jsonl"), folder.with_suffix(".outcome.json")
    warned = folder.with_suffix(".warnings.jsonl")
    for path in (log, outcome, warned):
        path.unlink(missing_ok=True)
    # A kernel cache of each run's own: with one cache, only the first run of a case
    # generates Warp's kernel code (and its DeprecationWarnings on Python 3.12+).
    warp_cache = folder.with_suffix(".warp-cache")
    shutil.rmtree(warp_cache, ignore_errors=True)
    env = wheelenv.clean_environ(
        PYTHONPATH=os.pathsep.join([str(SUPPORT), str(TESTS), *extra_paths]),
        PYTHONHASHSEED="0",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        XDG_CACHE_HOME=str(root / "xdg-cache"),
        WARP_CACHE_PATH=str(warp_cache),
        AUTOGRAD_GUARD_LOG=str(log),
        TWIN_OUTCOME=str(outcome),
        TWIN_WARNINGS=str(warned),
    )
    if variant == "handfix":
        env["TWIN_HANDFIX"] = "1"
    elif variant != "plain":
        env["AUTOGRAD_GUARD"] = variant
    start = time.monotonic()
    result = subprocess.run(
        [str(python), "main.py"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    seconds = time.monotonic() - start
    with open(root / "timings.tsv", "a") as timings:  # one line per run, for the slow ones
        timings.write(f"{seconds:.1f}\t{case.name}\t{variant}\n")
    return Outcome(
        variant=variant,
        folder=folder,
        returncode=result.returncode,
        stdout=result.stdout,
        stderr=result.stderr,
        exception=json.loads(outcome.read_text()) if outcome.exists() else None,
        files=_written(folder, before),
        events=_events(log),
        seconds=seconds,
        warnings=_warnings(warned, folder),
    )


def _write_sources(case: Case, folder: Path) -> dict[str, bytes]:
    sources = {"main.py": LAUNCHER, "case.py": case.source}
    sources.update((name, textwrap.dedent(text).lstrip("\n")) for name, text in case.files.items())
    if case.policy is not None:
        sources["autograd_guard.toml"] = textwrap.dedent(case.policy)
    for name, text in sources.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return _contents(folder)


def _contents(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def _written(folder: Path, before: dict[str, bytes]) -> dict[str, bytes]:
    """Files the program created or changed in its working folder (a deleted one maps to
    an empty marker)."""
    after = _contents(folder)
    written = {name: data for name, data in after.items() if before.get(name) != data}
    written.update({name: b"<deleted>" for name in before if name not in after})
    # Folders count too: an empty one (a stray cache folder) is a difference.
    for path in folder.rglob("*"):
        if path.is_dir() and "__pycache__" not in path.parts and not any(path.iterdir()):
            written[str(path.relative_to(folder)) + "/"] = b"<empty folder>"
    return written


def _events(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("action") != "summary"]


ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def _warnings(path: Path, folder: Path) -> list[Warned]:
    if not path.exists():
        return []
    warned = []
    for line in path.read_text().splitlines():
        kind, message, filename, lineno, hidden = json.loads(line)
        if filename.startswith(str(folder) + os.sep):
            filename = "<case>" + filename[len(str(folder)) :]
        warned.append(Warned(kind, ADDRESS.sub("0x?", message), filename, int(lineno), hidden))
    return warned
