"""Policy files: the shipped presets, where the policy is found, and reading its TOML.

Search order: ``AUTOGRAD_GUARD_POLICY`` (a path or a preset name); then the nearest folder
with an ``autograd_guard.toml`` or a ``pyproject.toml`` holding ``[tool.autograd_guard]``
(the former first within one folder), from the program's own folder up (the ``__main__``
script's folder, or the ``-m`` module's package), then from the working directory up;
then the shipped ``default`` preset. Start-up runs this code, so it sticks to ``os.path``:
pathlib and re cost milliseconds.
"""

from __future__ import annotations

import os

from autograd_guard._common import MAX_POLICY_BYTES as MAX_POLICY_BYTES  # where callers find it
from autograd_guard._common import environment as _environment
from autograd_guard._common.cache import DiskCache
from autograd_guard.errors import PolicyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any

POLICY_FILE = "autograd_guard.toml"


class Discovered:
    """Where the policy comes from: a description for messages, the file, whether it is
    a ``pyproject.toml`` (whose ``[tool.autograd_guard]`` table is the policy), and why
    this one is in force, in words."""

    __slots__ = ("description", "is_pyproject", "path", "why")

    def __init__(
        self, description: str, path: str, is_pyproject: bool = False, why: str = ""
    ) -> None:
        self.description = description
        self.path = path
        self.is_pyproject = is_pyproject
        self.why = why

    def __iter__(self) -> Iterator[Any]:  # unpacks like a tuple
        return iter((self.description, self.path, self.is_pyproject))

    def read(self, files: list[str] | None = None) -> dict[str, Any]:
        """The policy table; the file's path is added to ``files``."""
        return read_toml(self.description, self.path, self.is_pyproject, files)


def presets_dir() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package
    shipped = os.path.join(here, "policies")  # inside a wheel
    return shipped if os.path.isdir(shipped) else os.path.join(os.path.dirname(here), "policies")


def preset_names() -> list[str]:
    return sorted(n[:-5] for n in os.listdir(presets_dir()) if n.endswith(".toml"))


def preset_summary(name: str) -> str:
    """What a shipped preset is for, from its first line (``# autograd-guard preset
    "NAME": SUMMARY``): the docs and ``init`` list the presets from these files."""
    with open(os.path.join(presets_dir(), f"{name}.toml"), encoding="utf-8") as f:
        first = f.readline()
    return first.partition(f'preset "{name}"')[2].lstrip(":, ").strip()


def discover(
    environ: Mapping[str, str] | None,
    cwd: str,
    consulted: list[str] | None = None,
    program: str | None = None,
) -> Discovered:
    """Where the policy comes from: ``program`` (the program's own folder, see
    ``program_folder``) is searched before ``cwd``; the files looked at are added to
    ``consulted`` (a start plan holds while none of them changes, see ``_boot``)."""
    looked = [] if consulted is None else consulted
    named = _environment.policy_name(environ)
    if named:  # a name is a file's where one is there, else a preset's
        looked.append(os.path.join(cwd, os.path.expanduser(named)))
        found = resolve_named(named, "AUTOGRAD_GUARD_POLICY")
        found.why = "named by AUTOGRAD_GUARD_POLICY"
        return found
    starts = [(program, "the program's folder")] if program else []
    starts.append((cwd, "the working directory"))
    for start, why in starts:
        nearest = _nearest(os.path.abspath(start), looked)
        if nearest is not None:
            nearest.why = f"found from {why} {start} up"
            return nearest
    default = os.path.join(presets_dir(), "default.toml")
    places = " nor ".join(f"{why} {start}" for start, why in starts)
    return Discovered("preset default", default, why=f"no policy file from {places} up")


def _nearest(folder: str, looked: list[str]) -> Discovered | None:
    """The policy in ``folder`` or the nearest folder above it (as ruff finds its
    configuration), or None."""
    while True:
        candidate = os.path.join(folder, POLICY_FILE)
        pyproject = os.path.join(folder, "pyproject.toml")
        looked += [candidate, pyproject]
        if os.path.isfile(candidate):
            return Discovered(candidate, candidate)
        if os.path.lexists(candidate):  # a setup mistake: named, never passed over
            raise _not_a_policy_file(candidate)
        if os.path.isfile(pyproject) and _has_tool_table(pyproject):
            return Discovered(f"{pyproject} [tool.autograd_guard]", pyproject, True)
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def program_folder() -> str | None:
    """The folder of the program this interpreter runs, where a policy beside it is
    looked for: the ``__main__`` script's folder, or for ``python -m NAME`` the folder of
    NAME's package, found without importing anything. None for ``-c``, the REPL and
    standard input, and for a program installed in this environment (a console script,
    a module of site-packages): those follow the working directory."""
    import sys

    argv = getattr(sys, "argv", None) or [""]
    script = argv[0]
    if script == "-m":
        folder = _module_folder(getattr(sys, "orig_argv", None) or [], len(argv))
    elif script and script not in ("-c", "-"):
        path = os.path.abspath(script)
        folder = path if os.path.isdir(path) else os.path.dirname(path)
    else:
        return None
    if folder is None or not os.path.isdir(folder):
        return None
    prefixes = {os.path.abspath(p) + os.sep for p in (sys.prefix, sys.base_prefix)}
    return None if any((folder + os.sep).startswith(p) for p in prefixes) else folder


def _module_folder(orig_argv: list[str], count: int) -> str | None:
    """The folder of the ``-m`` module's package: ``orig_argv`` holds ``-m NAME`` (or
    ``-mNAME``) where ``sys.argv`` holds its ``count`` items, ``-m`` first."""
    if len(orig_argv) < count:
        return None
    name = orig_argv[-count]
    name = name[2:] if name.startswith("-m") else name
    parts = [part for part in name.split(".") if part]
    if not parts:
        return None
    import sys

    for root in [os.getcwd(), *sys.path]:  # -m puts the working directory first
        folder = os.path.join(root or os.curdir, parts[0])
        if os.path.isdir(folder) or os.path.isfile(folder + ".py"):
            break
    else:
        return None
    if not os.path.isdir(folder):
        return os.path.abspath(root or os.curdir)  # a top-level module: its folder
    for part in parts[1:]:
        if not os.path.isdir(os.path.join(folder, part)):
            break
        folder = os.path.join(folder, part)
    return os.path.abspath(folder)


def _not_a_policy_file(path: str) -> PolicyError:
    """``autograd_guard.toml`` is there but is no file: a dangling link, a folder, a FIFO."""
    if os.path.islink(path) and not os.path.exists(path):
        what = f"a symbolic link to {os.readlink(path)!r}, which does not exist"
        return PolicyError(path, "", what, "a policy file: fix or remove the link")
    what = "a folder" if os.path.isdir(path) else "a special file (a FIFO, socket or device)"
    return PolicyError(path, "", f"{what}, not a policy file", f"a TOML file named {POLICY_FILE}")


def _is_preset_name(named: str) -> bool:
    return named.replace("-", "_").isidentifier() and not named.endswith(".toml")


def resolve_named(named: str, key: str, relative_to: str | None = None) -> Discovered:
    """A preset name or a policy file path (``key``: where it was named). A name such as
    ``guardpolicy`` is a path where such a file exists, else a preset."""
    path = os.path.expanduser(named)
    if relative_to is not None and not os.path.isabs(path):
        path = os.path.join(relative_to, path)
    if _is_preset_name(named) and not (os.path.lexists(path) and not os.path.isdir(path)):
        name = named.lower()  # a keyword, in any case (``Strict``)
        preset = os.path.join(presets_dir(), f"{name}.toml")
        if not os.path.isfile(preset):
            raise _no_such_policy(key, named)
        return Discovered(f"preset {name}", preset)
    return Discovered(path, path)


def _no_such_policy(key: str, named: str) -> PolicyError:
    from autograd_guard.errors import closest

    presets = preset_names()
    return PolicyError(
        key,
        "",
        f"no preset or policy file named {named!r}",
        f"a preset name ({', '.join(presets)}) or a policy file path",
        closest(named, presets),
    )


def _has_tool_table(pyproject: str) -> bool:
    """A line opening ``[tool.autograd_guard...]`` or setting ``tool.autograd_guard.*``;
    checked on the bytes, so that a pyproject.toml without it is never parsed."""
    try:
        with open(pyproject, "rb") as f:
            lines = f.read(MAX_POLICY_BYTES).removeprefix(b"\xef\xbb\xbf").splitlines()
    except OSError:
        return False
    return any(
        line.lstrip().startswith((b"[tool.autograd_guard", b"tool.autograd_guard."))
        for line in lines
    )


def read_toml(
    description: str, path: str, is_pyproject: bool = False, files: list[str] | None = None
) -> dict[str, Any]:
    """The policy table in ``path``, which is added to ``files`` once read; parsed TOML is
    cached (see ``_common.cache``)."""
    raw = _read_policy_bytes(description, path)
    if files is not None:
        files.append(path)
    cache = DiskCache.shared()
    data = cache.get(path, raw)
    if data is None:
        data = _parse(description, raw, is_pyproject)
        cache.put(path, raw, data)
    return data


def _read_policy_bytes(description: str, path: str) -> bytes:
    """The file's bytes; never blocks or reads without end (a FIFO, ``/dev/zero``)."""
    import stat

    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise PolicyError(description, "", "not a regular file", "a TOML file")
        if info.st_size > MAX_POLICY_BYTES:
            raise PolicyError(
                description, "", f"{info.st_size} bytes", f"at most {MAX_POLICY_BYTES} bytes"
            )
        with open(path, "rb") as f:
            raw = f.read(MAX_POLICY_BYTES + 1)
    except PolicyError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        why = getattr(exc, "strerror", None) or str(exc)
        raise PolicyError(
            description, "", f"cannot read the policy file: {why}", "a readable TOML file"
        ) from None
    if len(raw) > MAX_POLICY_BYTES:
        raise PolicyError(description, "", "too large", f"at most {MAX_POLICY_BYTES} bytes")
    return raw


def _parse(description: str, raw: bytes, is_pyproject: bool) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef, import-not-found, unused-ignore]
    try:
        data = tomllib.loads(raw.decode("utf-8-sig"))  # a byte-order mark is fine
    except UnicodeDecodeError as exc:
        raise PolicyError(description, "", f"not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(description, "", f"invalid TOML: {exc}") from None
    except RecursionError:  # the parser recurses once per level of nested arrays or tables
        raise PolicyError(
            description,
            "",
            "arrays or tables nested too deeply to parse",
            "a few levels of nesting, as a policy needs",
        ) from None
    if is_pyproject:
        tool = data.get("tool", {})
        table = tool.get("autograd_guard", {}) if isinstance(tool, dict) else {}
        if not isinstance(table, dict):
            raise PolicyError(description, "tool.autograd_guard", "must be a table")
        return table
    return data
