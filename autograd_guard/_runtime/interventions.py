"""How a guard reports: ``report`` (an intervention: log it, raise in strict, say whether
to fix), ``refuse``, ``emit`` and ``fail``, the methods guards call; ``Guard`` inherits
them."""

from __future__ import annotations

from autograd_guard._events import events as _events
from autograd_guard._runtime.wrapper import describe_error
from autograd_guard.errors import GuardError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, NoReturn

    from autograd_guard._common.call import Call
    from autograd_guard._common.environment import Mode


class Interventions:
    """The reporting half of ``Guard``: events carry the guard's name, mode and version."""

    name: ClassVar[str] = ""
    remedy: ClassVar[str] = ""
    mode: Mode
    version: str | None

    def report(
        self, at: Call | str, action: str, event: str, *, remedy: str | None = None, **fields: Any
    ) -> bool:
        """An intervention (made, or one ``observe`` would make) ``at`` a call (or a call
        site): logged once per call site; in strict, logged as an error and raised. True
        means: apply the fix. The one way a guard reports what it changes."""
        if isinstance(at, str):
            callsite = at
        else:
            callsite = at.callsite
            fields = {"target": str(at.target), **fields}  # first, as logged before
        if self.mode == "strict":
            self.refuse(event, action=action, callsite=callsite, remedy=remedy, **fields)
        self.emit(event, action=action, callsite=callsite, remedy=remedy, **fields)
        return self.mode == "fix"

    def refuse(
        self,
        event: str,
        *,
        action: str,
        callsite: str,
        remedy: str | None = None,
        log: bool = True,
        **fields: Any,
    ) -> NoReturn:
        """Strict mode: log ``event`` as an error (unless another process logs it for
        this one: a group's first rank) and raise it, naming the remedy."""
        if log:
            self.emit(
                event, action=action, callsite=callsite, level="error", remedy=remedy, **fields
            )
        raise GuardError(
            f"autograd-guard [{self.name}] at {callsite}: {event}. Remedy: {remedy or self.remedy}"
        )

    def emit(
        self,
        event: str,
        *,
        action: str,
        callsite: str,
        level: str = "warning",
        remedy: str | None = None,
        **fields: Any,
    ) -> bool:
        return _events.emit(
            event,
            guard=self.name,
            action=action,
            callsite=callsite,
            level=level,
            mode=self.mode,
            version=self.version,
            remedy=remedy or self.remedy,
            **fields,
        )

    def fail(self, stage: str, exc: BaseException) -> None:
        """The guard's own code broke: report it once; raise only in strict mode (a
        ``GuardError`` the guard raised itself, in strict, was reported already: it goes
        on as it is)."""
        if isinstance(exc, GuardError) and self.mode == "strict":
            raise exc
        self.emit(
            f"guard error in {stage}; the library's own behaviour was kept",
            action="guard_error",
            callsite=f"{stage}:{type(exc).__name__}",
            level="error",
            error=describe_error(exc),
            remedy="a bug in the guard: please report it with this event",
        )
        if self.mode == "strict":
            raise GuardError(
                f"autograd-guard [{self.name}] failed in {stage}: {describe_error(exc)}"
            ) from exc
