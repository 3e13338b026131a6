"""The peer libraries' own test suites, unguarded, under ``AUTOGRAD_GUARD=strict`` (the
``.pth``: findings at exit set the status, 3) and under ``pytest --autograd-guard=strict``
(the plugin, which uninstalls the guard as the session ends: no findings at exit): each must
end with the same exit status (grad_health's findings in a suite that passes are
false ones: a layer a test attaches and never calls, gradients a test sets by hand).

The tests come from each library's source at the version ``thirdparty.py`` installs: the
sdist (``pip download --no-deps --no-binary :all:``), or, where the sdist holds no tests
(Lightning), a checkout of its repository at the release tag passed with ``--source``. The
library itself is the one ``thirdparty.py`` installs, first on ``PYTHONPATH``.

    python scripts/peer_suites.py pytorch_optimizer [--only bare|strict|plugin] [-- PYTEST ARGS]
    python scripts/peer_suites.py accelerate -- tests/test_optimizer.py
    python scripts/peer_suites.py lightning --source ~/pytorch-lightning -- \\
        tests/tests_pytorch/loops/test_training_loop.py

Prints, per run, the exit status, pytest's last line and the guard's events by action.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import thirdparty

# suite -> (the thirdparty.py entry, the tests' folder in its source, pytest arguments of
# its own (its pyproject's addopts need plugins not installed here), the folder its tests
# import their helpers from)
SUITES = {
    "pytorch_optimizer": ("pytorch_optimizer", "tests", ["-o", "addopts="], "."),
    "accelerate": ("accelerate", "tests", ["-o", "addopts="], "."),
    "lightning": ("lightning", "tests/tests_pytorch", ["-o", "addopts="], "tests"),
}


def version(library: str) -> str:
    [pin] = [
        r.split("==")[1] for r in thirdparty.PACKAGES[library][0] if r.split("==")[0] == library
    ]
    return pin


def sdist(library: str, into: Path) -> Path:
    """The library's source release, unpacked: its root folder."""
    spec = f"{library}=={version(library)}"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         "--no-build-isolation", spec, "-d", str(into)],
        check=True, capture_output=True,
    )  # fmt: skip
    [archive] = into.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return next(p for p in into.iterdir() if p.is_dir())


def run(root: Path, suite: str, args: list[str], mode: str | None) -> dict[str, object]:
    library, *_, helpers = SUITES[suite]
    folder = thirdparty.install(library)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(root / helpers)])}
    env.pop("AUTOGRAD_GUARD", None)
    log = Path(tempfile.mkdtemp()) / "events.jsonl"
    guard = ["--autograd-guard=strict"] if mode == "plugin" else []
    if mode:
        env["AUTOGRAD_GUARD_LOG"] = str(log)
    if mode == "strict":
        env["AUTOGRAD_GUARD"] = "strict"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *guard, *args]
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    actions = collections.Counter(
        f"{e['guard']}/{e['action']}:{e['level']}" for e in events if e["action"] != "summary"
    )
    return {"status": result.returncode, "last": lines[-1] if lines else "", "events": actions}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--source", type=Path, help="the library's source (else the sdist)")
    parser.add_argument("--only", choices=["bare", "strict", "plugin"], action="append")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    options = parser.parse_args(argv[:cut])
    options.pytest = argv[cut + 1 :]  # pytest arguments (default: the whole suite)
    library, tests, own, _ = SUITES[options.suite]
    root = options.source or sdist(library, Path(tempfile.mkdtemp()))
    args = [*own, *(options.pytest or [tests])]
    statuses = {}
    for mode in options.only or ("bare", "strict", "plugin"):
        outcome = run(root, options.suite, args, None if mode == "bare" else mode)
        statuses[mode] = outcome["status"]
        print(f"{options.suite} {version(library)} {mode}: {json.dumps(outcome)}", flush=True)
    if len(statuses) > 1:
        same = len(set(statuses.values())) == 1
        print(f"{options.suite}: exit status {'the same' if same else 'DIFFERS'}: {statuses}")
        sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
