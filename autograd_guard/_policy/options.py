"""One guard- or rule-specific policy key: its type, default, allowed values and doc.

A leaf module, so that the guard contract can declare options without the policy code.
"""

from __future__ import annotations

from autograd_guard._common.environment import LOG_KEYWORDS
from autograd_guard.errors import PolicyError, closest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, ClassVar, Protocol

    class GuardOptions(Protocol):
        """What the policy reads of a guard class (``_runtime.guard.Guard`` has it): the
        policy sits below the runtime, so it knows a guard only by this shape."""

        name: ClassVar[str]
        options: ClassVar[dict[str, Option]]
        rule_action: ClassVar[str]
        rule_options: ClassVar[dict[str, Option]]

    Guards = list[type[GuardOptions]]  # the guard classes whose tables a policy has


MAX_STRING = 4096
MAX_LIST = 1024


class Option:
    """One guard- or rule-specific policy key, with its type and allowed values."""

    __slots__ = ("choices", "default", "doc", "items", "kind", "maximum", "minimum")

    def __init__(
        self,
        kind: type,
        default: Any,
        doc: str = "",
        *,
        choices: Sequence[str] = (),
        minimum: float | None = None,
        maximum: float | None = None,
        items: tuple[type, ...] = (str,),
    ) -> None:
        self.kind = kind
        self.items = items  # what a list may hold: strings, or also positions (int)
        self.default = default
        self.doc = doc
        self.choices = tuple(choices)
        self.minimum = minimum
        self.maximum = maximum

    def allowed(self) -> str:
        if self.choices:
            return ", ".join(repr(c) for c in self.choices)
        if self.kind is list:
            return "a list of names or positions" if int in self.items else "a list of strings"
        name = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
        text = name[self.kind]
        low, high = _number(self.minimum), _number(self.maximum)
        if low and high:
            return f"{text} from {low} to {high}"
        if low or high:
            return f"{text} {'>= ' + low if low else '<= ' + high}"
        return text

    def check(self, source: str, key: str, value: Any) -> Any:
        is_bool = isinstance(value, bool)
        ok = isinstance(value, self.kind) and not (self.kind is not bool and is_bool)
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if ok and self.kind is list:
            ok = len(value) <= MAX_LIST and all(self._item_ok(v) for v in value)
            value = list(value)
        if ok and self.kind is str:
            ok = len(value) <= MAX_STRING
        if ok and self.choices and isinstance(value, str):  # keywords, in any case
            value = next((c for c in self.choices if c.lower() == value.lower()), value)
            ok = value in self.choices
        if ok and self.kind in (int, float):
            ok = (
                (self.minimum is None or value >= self.minimum)
                and (self.maximum is None or value <= self.maximum)
                and value == value
            )
        if not ok:
            raise PolicyError(
                source,
                key,
                f"invalid value {short(value)}{self._quoted(value)}",
                self.allowed(),
                closest(value, self.choices),
            )
        return value

    def _quoted(self, value: Any) -> str:
        """Why a quoted ``"false"`` or ``"3"`` is refused: TOML's quotes make it a string."""
        if not isinstance(value, str) or self.kind not in (bool, int, float):
            return ""
        text = value.strip()
        if self.kind is bool and text.lower() in ("true", "false"):
            return f": a string where a boolean is expected; write {text.lower()} without quotes"
        try:
            float(text) if self.kind is float else int(text)
        except ValueError:
            return ""
        kind = "an integer" if self.kind is int else "a number"
        return f": a string where {kind} is expected; write {text} without quotes"

    def _item_ok(self, value: Any) -> bool:
        if isinstance(value, str):
            return str in self.items and 0 < len(value) <= MAX_STRING
        if isinstance(value, int) and not isinstance(value, bool):
            return int in self.items and 0 <= value <= MAX_LIST
        return False


def _number(bound: float | None) -> str:
    """A range bound in words: ``0`` rather than ``0.0``, nothing for no bound."""
    if bound is None:
        return ""
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def short(value: Any) -> str:
    """``repr(value)``, cut to 60 characters for messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def log_destination(source: str, key: str, value: Any) -> str:
    """A file path, or a keyword in any case (``Stderr`` is stderr, never a file); a near
    miss of a keyword (``stdrr``: a file of that name was never meant) is refused, and a
    path (a folder or an extension in it) is never one."""
    text: str = Option(str, None).check(source, key, value)
    log = text.lower() if text.lower() in LOG_KEYWORDS else text
    meant = closest(log, LOG_KEYWORDS)
    if log in LOG_KEYWORDS or not meant or any(c in log for c in "./\\"):
        return log
    raise PolicyError(
        source,
        key,
        f"{short(log)} is no keyword and looks like a typo of one; events go to stderr",
        f"{', '.join(LOG_KEYWORDS)}, or a file path (with a folder or an extension)",
        meant,
    )
