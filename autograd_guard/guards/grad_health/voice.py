"""What every part of grad_health speaks through: the guard's events, its refusals (strict),
its own failures, and the mode and options the run was set up with. ``GradHealth`` makes
one ``Voice`` and hands it to each part when the part is made; no part keeps any other
reference to the guard."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, NoReturn

    from autograd_guard._common.environment import Mode


class Voice:
    """``emit`` (an event), ``refuse`` (strict: log and raise ``GuardError``), ``fail``
    (the guard's own error: said once, raised only in strict), the ``mode`` and the
    options (``config``)."""

    __slots__ = ("config", "emit", "fail", "mode", "refuse")

    def __init__(
        self,
        emit: Callable[..., bool],
        refuse: Callable[..., NoReturn],
        fail: Callable[[str, BaseException], None],
        mode: Mode,
        config: Mapping[str, Any],
    ) -> None:
        self.emit, self.refuse, self.fail = emit, refuse, fail
        self.mode, self.config = mode, config
