"""The lowest layer, shared by every other: the process state, the environment variables, the
disk cache, post-import hooks, call sites, the call model (``Call``, ``Target``) and installed
versions. Imports nothing of the package above it (the root's ``errors`` sits beside it).

This package's own module is what a start with ``AUTOGRAD_GUARD`` set reads before anything
else of the package is loaded (the bootstrap imports only it): the process's state
(``STATE``, with a reset, as structlog's ``_config``), the version, and the cache's plain
reads (which file, its entries, the ``sys.path`` fingerprint, a file's stamp). Each module
imported at start-up costs some 0.4M instructions, so these share one module, which imports
no ``__future__`` (a module import of its own) and no ``typing``: annotations that name a
type only a checker knows are strings.

Every engine module keeps what it must remember in ``STATE`` instead of in module globals,
so that tests and ``uninstall()`` can see and reset it in one place, and a forked child
gets fresh locks in one place.
"""

import _thread
import marshal
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# Every environment variable of the guard's (``environment`` says what each means)
VARIABLES = (
    "AUTOGRAD_GUARD",
    "AUTOGRAD_GUARD_POLICY",
    "AUTOGRAD_GUARD_DISABLE",
    "AUTOGRAD_GUARD_LOG",
    "AUTOGRAD_GUARD_CACHE",
)
VERSION = "0.1.0"  # ``autograd_guard.__version__``; start plans are keyed by it
OFF_VALUES = frozenset({"", "0", "off", "false", "no"})  # of AUTOGRAD_GUARD and the cache's
CACHE_SCHEMA = 2  # of the cache files: a file of another schema is ignored and rewritten
MAX_POLICY_BYTES = 1 << 20  # a policy file larger than this is refused


def cache_folder(environ: "Mapping[str, str] | None" = None) -> "str | None":
    """Where parsed policies and entry points are cached; None when switched off, or when
    there is no home to put it in (``HOME`` unset and no passwd entry, as for a container
    user by uid): never a ``~`` folder in the working directory."""
    env = os.environ if environ is None else environ
    if env.get("AUTOGRAD_GUARD_CACHE", "").strip().lower() in OFF_VALUES - {""}:
        return None
    base = env.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset, or relative: the XDG spec ignores it
        home = env.get("HOME") or os.path.expanduser("~")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return os.path.join(base, "autograd-guard")


def cache_file(folder: "str | None", section: str) -> "str | None":
    """The file of one kind of cache entry (``tables``, ``plans``...) of this environment
    (``sys.prefix``: two environments that alternate never evict each other's entries)."""
    if folder is None:
        return None
    digest = 0xCBF29CE484222325  # FNV-1a of sys.prefix (hash() is salted per process)
    for byte in sys.prefix.encode("utf-8", "surrogateescape"):
        digest = ((digest ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return os.path.join(folder, f"{section}-{digest:016x}.marshal")


def read_entries(file: "str | None") -> "dict[str, Any]":
    """A cache file's entries, or none if it is missing, broken or of another schema."""
    if file is None:
        return {}
    try:
        loaded = marshal.loads(read_bytes(file, 1 << 26))
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if not isinstance(loaded, dict) or loaded.get("schema") != CACHE_SCHEMA:
        return {}
    entries = loaded.get("entries")
    if not isinstance(entries, dict):
        return {}
    return {k: v for k, v in entries.items() if isinstance(k, str)}


def read_bytes(path: str, limit: int) -> bytes:
    """At most ``limit`` bytes of the file: ``os.read`` rather than ``open()``, whose file
    object (a buffered reader on a raw one) costs more than the read itself."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        chunks = []
        while limit > 0:
            chunk = os.read(fd, min(limit, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            limit -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def path_fingerprint() -> "list[list[Any]]":
    """``[folder, mtime_ns]`` of each folder on ``sys.path``: installing or removing a
    distribution changes its folder's mtime (what entry points and start plans depend on)."""
    stamps: list[list[Any]] = []
    for path in sys.path:
        try:
            stamps.append([path, os.stat(path or ".").st_mtime_ns])
        except OSError:
            continue
    return stamps


def stamp(path: str) -> "list[Any] | None":
    """The file's size and a checksum of its bytes (None: there is nothing at ``path``): a
    policy replaced by one of the same size and mtime (``cp -p``, ``tar x``, images with
    fixed timestamps) is a new policy. Something there that cannot be read stamps as such."""
    if not os.access(path, os.F_OK, follow_symlinks=False):  # no exception to make
        return None
    try:
        data = read_bytes(path, MAX_POLICY_BYTES + 1)
    except OSError:
        return [path, -1, 0]
    # The bytes as one number modulo a prime: stable across processes (hash() is salted)
    # and without importing zlib or hashlib at start-up.
    return [path, len(data), int.from_bytes(data, "little") % _PRIME]


_PRIME = 2**64 - 59  # the largest 64-bit prime (a Mersenne prime would weigh bytes 61 apart alike)


class State:
    """What the guard remembers in this process."""

    def __init__(self) -> None:
        self.started = False  # the auto-load ran (bootstrap)
        self.summary_registered = False  # atexit runs the summary (once per process)
        self.forks_followed = False  # the fork handlers are registered (follow_forks)
        self.make_locks()
        self.reset()

    def make_locks(self) -> None:
        self.engine_lock = _thread.RLock()  # install / uninstall / status
        self.import_lock = _thread.RLock()  # post-import hooks
        self.patch_lock = _thread.RLock()  # patches applied and undone
        self.event_lock = _thread.allocate_lock()  # event counts and listeners
        self.logger_lock = _thread.allocate_lock()  # building the logger (imports structlog)

    def reset(self) -> None:
        """Forget everything: the install, the events, the guards registered in code and
        what was cached (for tests; patches must be undone first, see ``uninstall()``)."""
        self.error: str | None = None
        self.registered: list[Any] = []  # guard classes added by ``guards.register``
        self.forget_install()
        # events
        self.counts: dict[tuple[str, str, str], int] = {}  # since the last reset
        self.totals: dict[tuple[str, str, str], int] = {}  # the process's, for the summary
        self.listeners: list[Any] = []
        self.log = "stderr"  # where events go: the policy's ``log`` key
        self.log_source = "default"  # where that was set, for messages
        self.logger: Any = None
        self.exit_checks: list[Any] = []  # run at exit, before the summary
        self.exit_status = 0  # strict: a finding ends the process with this status
        self.exit_pid = 0  # the process that found it
        self.muted = False  # a command of the command line runs: events are counted, not shown
        self.process: tuple[int, str] | None = None

    def forget_install(self) -> None:
        """Forget the installed policy and guards, hooks, patches and caches (what
        ``uninstall()`` leaves behind once it has undone the patches and hooks); events,
        registered guards and the last policy error are kept."""
        # engine
        self.policy: Any = None
        self.guards: list[Any] = []
        # post-import hooks
        self.hooks: dict[str, list[Any]] = {}
        self.finder: Any = None
        self.watch: Any = None  # the bootstrap's finder, until a planned module's import
        # patches: (owner, attribute, original, replacement), undone in reverse
        self.applied: list[tuple[object, str, object, object]] = []
        # the modules of traceable copies of remedies (_compile.compiled.traceable), by name
        self.traced_modules: list[str] = []
        # caches: installed versions by distribution (_common.versions), the resumable kind of
        # each target (guards.grad_mode), the cache files of the cache folder (_common.cache)
        self.versions: dict[str, str | None] = {}
        self.kinds: dict[Any, str] = {}
        self.disk_cache: Any = None

    # -- fork ----------------------------------------------------------------------------
    def follow_forks(self) -> None:
        """Run the handlers below at each fork, from the engine's first use on (once per
        process). Not at import: a start that installs nothing (its plan's modules never
        imported) would pay for them at exit, some 2% of an interpreter's start; until the
        engine runs, only the main thread's start-up takes a lock."""
        if self.forks_followed or not hasattr(os, "register_at_fork"):
            return
        self.forks_followed = True
        os.register_at_fork(
            before=self.before_fork,
            after_in_parent=self.after_fork_in_parent,
            after_in_child=self.after_fork_in_child,
        )

    def before_fork(self) -> None:
        # A child forked while another thread holds a lock, or is half-way through
        # importing structlog for the first event, would wait for ever: fork between those.
        self.logger_lock.acquire(timeout=5)
        self.event_lock.acquire(timeout=5)

    def after_fork_in_parent(self) -> None:
        for lock in (self.event_lock, self.logger_lock):
            if lock.locked():
                try:  # noqa: SIM105 - contextlib costs start-up time
                    lock.release()
                except RuntimeError:  # taken by another thread after the timeout
                    pass

    def after_fork_in_child(self) -> None:
        # A lock held by another thread at fork time would never be released here.
        self.make_locks()
        for guard in self.guards:
            guard._lock = _thread.allocate_lock()


STATE = State()
