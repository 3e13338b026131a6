"""Interpreter start-up: run by ``autograd_guard.pth`` only when ``AUTOGRAD_GUARD`` is set.

The boot layer, the highest below the public surface: this bootstrap, then ``plan`` (the
start plan), which loads the engine at the first import of a watched module.

Imports nothing beyond what ``site`` already has loaded. The real work waits until
``sitecustomize``/``usercustomize`` have run, so that ``sys.path`` is complete, as
autowrapt does.
"""

from __future__ import annotations

import sys

from autograd_guard._common.state import STATE


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
        from autograd_guard._boot import plan as _startup

        _startup.start()
    except BaseException as exc:  # start-up must never crash the host program
        sys.stderr.write(f"autograd-guard: not started, running unguarded: {exc!r}\n")


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
