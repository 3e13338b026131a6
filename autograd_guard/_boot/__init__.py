"""Interpreter start-up: run by ``autograd_guard.pth`` only when ``AUTOGRAD_GUARD`` is set.

The boot layer, the highest below the public surface: this bootstrap, then ``plan``, which
makes start plans and loads the engine at the first import of a watched module.

With a start plan that holds (the modules the guards watched at the last whole install,
trusted while the files it read and consulted and the folders on ``sys.path`` are as they
were), a start imports three modules of the package: ``autograd_guard``, this one and
``_common``'s own. Each module costs start-up time, so none of them imports ``__future__``
or ``typing`` at run time, the plan is checked here rather than in ``plan`` (which the
slow path imports), and the plan's modules are watched by a finder of its own
(``_Watch``) until one of them is imported.

The real work waits until ``sitecustomize``/``usercustomize`` have run, so that
``sys.path`` is complete, as autowrapt does.
"""

import os
import sys

from autograd_guard._common import (
    STATE,
    VARIABLES,
    VERSION,
    cache_file,
    cache_folder,
    path_fingerprint,
    read_entries,
    stamp,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def bootstrap(now: bool = False) -> None:
    """Start the guard once per process, however many times the ``.pth`` is processed."""
    if STATE.started:
        return
    STATE.started = True
    if _is_command_line():  # its output is its report: no event lines of the guard's own
        STATE.muted = True
    site = sys.modules.get("site")
    if not now and site is not None and _inside_site_main(site):
        _run_after_customize(site)
    else:
        start()


def start() -> None:
    """Install from the environment; never let a failure here stop the interpreter."""
    try:
        _start()
    except BaseException as exc:  # start-up must never crash the host program
        sys.stderr.write(f"autograd-guard: not started, running unguarded: {exc!r}\n")


def _start() -> None:
    """The auto-load: from the plan if it holds, else the whole install (and a new plan)."""
    key = plan_key()
    modules = _modules_if_valid(read_entries(cache_file(cache_folder(), "plans")).get(key))
    if modules is None:
        from autograd_guard._boot import plan

        plan.install_now(key)
        return
    STATE.watch = _Watch(modules)
    sys.meta_path.insert(0, STATE.watch)
    if any(name in sys.modules for name in modules):  # imported before the start
        from autograd_guard._boot import plan

        plan.hook_the_plan()


def plan_key() -> str:
    """What a plan is made for: this package (its folder, version and guard modules), the
    working directory, the program (policy discovery starts from its folder) and every
    variable of the guard's."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:  # a guard module added or removed (an editable install) changes the folder
        layout = str(os.stat(os.path.join(package, "guards")).st_mtime_ns)
    except OSError:
        layout = ""
    settings = [os.environ.get(name, "") for name in VARIABLES]
    argv = getattr(sys, "argv", None) or [""]
    program = os.path.dirname(argv[0])  # a script's folder (relative to the directory)
    if argv[0] == "-m":  # the module's name: sys.orig_argv holds it where sys.argv has -m
        program = (getattr(sys, "orig_argv", None) or [""] * len(argv))[-len(argv)]
    return "\0".join([package, VERSION, layout, os.getcwd(), program, *settings])


def _modules_if_valid(plan: "Any") -> "list[str] | None":
    """The plan's modules, if its shape is right and nothing it depends on changed: the
    policy files it read, the files policy discovery looked at (the same file is still
    the one discovered) and the folders on ``sys.path``."""
    if not isinstance(plan, dict):
        return None
    files, consulted, modules = plan.get("files"), plan.get("consulted"), plan.get("modules")
    if not (isinstance(files, list) and files and isinstance(modules, list)):
        return None
    if not (isinstance(consulted, list) and all(isinstance(m, str) for m in modules)):
        return None
    if plan.get("path") != path_fingerprint():
        return None
    for entry in files + consulted:
        if not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], str):
            return None
        if stamp(entry[0]) != entry[1]:
            return None
    return modules


class _Watch:
    """The plan's finder, until one of its modules is imported: a set lookup per import,
    no lock and no hook (``_common.importer``, with both, would be one more module to
    import at every start). That first import hands the plan to the importer's hooks,
    and its finder then finds the module (see ``plan.hook_the_plan``)."""

    def __init__(self, modules: "list[str]") -> None:
        self.modules = frozenset(modules)

    def find_spec(self, name: str, path: "Any" = None, target: "Any" = None) -> "Any":
        if name not in self.modules:
            return None
        from autograd_guard._boot import plan

        plan.hook_the_plan()
        finder = STATE.finder
        return None if finder is None else finder.find_spec(name, path, target)

    def invalidate_caches(self) -> None:
        pass


def _is_command_line() -> bool:
    """This process runs the ``autograd-guard`` command (a console script, or ``python -m
    autograd_guard.cli``): its own start must not print events into its output."""
    script = sys.argv[0] if sys.argv else ""
    if script.replace("\\", "/").rpartition("/")[2].partition(".")[0] == "autograd-guard":
        return True
    argv = getattr(sys, "orig_argv", ())
    return "-m" in argv and "autograd_guard.cli" in argv


def _inside_site_main(site: object) -> bool:
    main_code = getattr(getattr(site, "main", None), "__code__", None)
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is main_code:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _run_after_customize(site: object) -> None:
    # site.main() calls execusercustomize() last when the user site is on, else
    # execsitecustomize(); both are looked up as module globals, so wrapping works.
    name = "execusercustomize" if getattr(site, "ENABLE_USER_SITE", False) else "execsitecustomize"
    original = getattr(site, name)

    def run_customize_then_start() -> None:
        setattr(site, name, original)
        try:
            original()
        finally:
            start()

    setattr(site, name, run_customize_then_start)
