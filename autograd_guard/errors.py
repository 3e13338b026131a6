"""The two exceptions autograd-guard raises on purpose."""

from __future__ import annotations


class GuardError(RuntimeError):
    """Raised at a risky call in ``strict`` mode, naming the guard, call site and remedy."""


class PolicyError(ValueError):
    """A policy file or value that cannot be used: names the file, the key and what is allowed."""

    def __init__(self, source: str, key: str, problem: str, allowed: str = "") -> None:
        self.source = source
        self.key = key
        self.problem = problem
        self.allowed = allowed
        text = f"{source}: {key}: {problem}" if key else f"{source}: {problem}"
        if allowed:
            text += f" (allowed: {allowed})"
        super().__init__(text)
