"""``autograd-guard run -- CMD``: what it cannot guard, said before it runs.

Symptom: ``autograd-guard run -- python -S train.py`` ran the program unguarded and said
nothing, although ``run --help`` promises to cover interpreters that skip ``.pth`` files:
``-S`` skips the ``site`` module, and with it both ways the guard starts (the ``.pth``
line and the ``sitecustomize`` that ``run`` puts on ``PYTHONPATH``).

Affected: every version before this module (0.1.0).

Remedy: a Python command with ``-S`` among its interpreter options is refused with one
plain line and exit status 2 (nothing ran): the program can drop ``-S``, or call
``autograd_guard.install()`` itself.
"""

from __future__ import annotations

import os

TAKES_VALUE = ("-W", "-X", "--check-hash-based-pycs")  # interpreter options with a value
STOP_STATUS = 2


def refusal(cmd: list[str]) -> str:
    """Why ``cmd`` cannot be guarded, in one line; "" where it can."""
    if not _is_python(cmd[0]) or not _skips_site(cmd[1:]):
        return ""
    return (
        f"autograd-guard run: cannot guard {' '.join(cmd[:2])}...: -S skips Python's site "
        "module, where the guard starts; drop -S, or call autograd_guard.install() in the "
        "program (nothing was run)"
    )


def _is_python(program: str) -> bool:
    name = os.path.basename(program).lower().removesuffix(".exe")
    return name == "python" or (name.startswith("python") and name[6:].replace(".", "").isdigit())


def _skips_site(args: list[str]) -> bool:
    """``-S`` among the interpreter's options: those before the script, ``-c`` or ``-m``."""
    rest = iter(args)
    for arg in rest:
        if arg in TAKES_VALUE:
            next(rest, None)
            continue
        if not arg.startswith("-") or arg == "-" or arg.startswith("--"):
            return False  # the script, standard input, or a long option
        for flag in arg[1:]:
            if flag == "S":
                return True
            if flag in "cm":  # what follows is the program's
                return False
            if flag in "WX":  # its value is the rest of the word (-Wignore)
                break
    return False
