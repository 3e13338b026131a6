"""The policy as plain data: what it says about each guard, its rules, and the mode that
applies to a guard. Never imports or runs code."""

from __future__ import annotations

from autograd_guard.errors import PolicyError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from autograd_guard._common.environment import Mode


class GuardSettings:
    """What the policy says about one guard."""

    __slots__ = ("enabled", "force", "mode", "name", "options")

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        self.name = name
        self.enabled = True
        self.mode: Mode | None = None
        self.force = False
        self.options = options


class Rule:
    """A user rule: ``action`` applies to the callable at ``target`` (``module:qualname``)."""

    __slots__ = ("action", "key", "options", "origin", "target")

    def __init__(
        self,
        target: str,
        action: str,
        options: dict[str, Any],
        origin: str = "<dict>",
        key: str = "rules",
    ) -> None:
        self.target = target
        self.action = action
        self.options = options
        self.origin = origin  # the policy file (or preset) that holds the rule
        self.key = key  # "rules[3]" in that file

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.target.partition(":")[2]


class Policy:
    """A validated policy. ``env_mode`` and ``disabled`` come from the environment."""

    def __init__(
        self,
        source: str,
        mode: Mode,
        log: str | None,
        disabled: set[str],
        guards: dict[str, GuardSettings],
        rules: list[Rule],
    ) -> None:
        self.source = source
        self.mode = mode
        self.log = log
        self.disabled = disabled
        self.guards = guards
        self.rules = rules
        self.env_mode: Mode | None = None
        self.log_source = "AUTOGRAD_GUARD_LOG"  # where ``log`` was set, for messages
        self.files: list[str] = []  # the policy files read, ``extends`` included
        self.why = ""  # why this policy is in force (found where, or named by what)
        # Setup mistakes that leave the policy usable (an unknown guard to disable).
        self.warnings: list[PolicyError] = []

    def mode_for(self, guard: str) -> Mode:
        """The mode that applies to ``guard``: off, observe, fix or strict."""
        settings = self.guards.get(guard)
        if "*" in self.disabled or guard in self.disabled:
            return "off"
        if settings is not None and (not settings.enabled or settings.mode == "off"):
            return "off"
        if self.env_mode is not None:
            return self.env_mode
        if settings is not None and settings.mode is not None:
            return settings.mode
        return self.mode

    def rules_for(self, action: str) -> list[Rule]:
        return [r for r in self.rules if r.action == action]
