"""The exceptions autograd-guard raises on purpose, and the "did you mean" of its messages."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from types import TracebackType
    from typing import Any, TypeVar

    T = TypeVar("T")
    E = TypeVar("E", bound=BaseException)

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class GuardError(RuntimeError):
    """Raised at a risky call in ``strict`` mode, naming the guard, call site and remedy."""


def drop_own_frames(error: E) -> E:
    """``error`` with the frames of this package dropped from its traceback, to be raised
    again by the outermost frame of the guard (a wrapper, a hook), which the ``raise`` adds
    back: a strict error's traceback shows the user's frames and the library's, then one of
    ours, not the guard's internals. The same object, its cause and context kept."""
    kept: list[TracebackType] = []
    entry = error.__traceback__
    while entry is not None:
        if not entry.tb_frame.f_code.co_filename.startswith(PACKAGE_DIR):
            kept.append(entry)
        entry = entry.tb_next
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = type(entry)(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return error.with_traceback(rebuilt)


class Refused:
    """A strict ``GuardError`` that a function of the guard returned instead of raising,
    for the guard's outermost frame to raise where Dynamo traces that frame (a frame that
    catches around a graph break would not compile): its traceback then shows the user's
    frames and the library's, then that one frame."""

    __slots__ = ("error",)

    def __init__(self, error: GuardError) -> None:
        self.error = drop_own_frames(error)


def returning_refusals(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, returning a ``Refused`` where it raised a ``GuardError``."""

    def returning_refusals(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except GuardError as strict:
            return Refused(strict)

    return returning_refusals


class PolicyError(ValueError):
    """A policy file or value that cannot be used: names the file, the key and what is allowed.

    ``suggestion`` is the allowed value closest to what was written ("did you mean").
    """

    def __init__(
        self, source: str, key: str, problem: str, allowed: str = "", suggestion: str = ""
    ) -> None:
        self.source = source
        self.key = key
        self.problem = problem
        self.allowed = allowed
        self.suggestion = suggestion
        self.problems: list[PolicyError] = [self]
        text = f"{source}: {key}: {problem}" if key else f"{source}: {problem}"
        if suggestion:
            text += f"; did you mean {suggestion!r}?"
        if allowed:
            text += f" (allowed: {allowed})"
        super().__init__(text)


class PolicyErrors(PolicyError):
    """Every problem of one policy, so that they can all be fixed in one go: its text names
    them all on one line, its source and key are the first one's."""

    def __init__(self, problems: list[PolicyError]) -> None:
        first = problems[0]
        super().__init__(first.source, first.key, first.problem, first.allowed, first.suggestion)
        self.problems = list(problems)
        self.args = (" | ".join(str(problem) for problem in problems),)


class Problems:
    """Every problem found in one policy and the files it extends, reported all at once."""

    __slots__ = ("found",)

    def __init__(self) -> None:
        self.found: list[PolicyError] = []

    def attempt(self, check: Callable[..., T], *args: Any) -> T | None:
        """``check(*args)``, or None after noting the problem it raised."""
        try:
            return check(*args)
        except PolicyError as exc:
            self.found.extend(exc.problems)
            return None

    def add(self, *args: str) -> None:
        self.found.append(PolicyError(*args))

    def raise_if_any(self) -> None:
        """Raise what was found: one problem as itself, several as ``PolicyErrors``."""
        if len(self.found) == 1:
            raise self.found[0]
        if self.found:
            raise PolicyErrors(self.found)


def closest(word: object, choices: Iterable[str]) -> str:
    """The choice closest to ``word`` (a typo's intended word), or "" when none is close."""
    if not isinstance(word, str) or not word:
        return ""
    options = [c for c in choices if c]
    for choice in options:  # "Stderr" for "stderr": the same word in another case
        if choice.lower() == word.lower():
            return choice
    import difflib  # only on the error path

    found = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return found[0] if found else ""
