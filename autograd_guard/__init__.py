"""autograd-guard: a run-time guard that keeps gradients correct in PyTorch programs.

The ``autograd_guard.pth`` file imports this package at interpreter start when
``AUTOGRAD_GUARD`` is set, so it has no module-level imports: everything is loaded
on first use. It is imported before pytest loads the package's plugin, so pytest must
not try to rewrite it (its warning fails ``pytest -W error``): PYTEST_DONT_REWRITE.
No ``from __future__`` import either (a module import of its own at every start):
annotations that name a type only a checker knows are strings.
"""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from autograd_guard._policy.policy import Policy
    from autograd_guard.errors import GuardError, PolicyError

    __version__: str  # served by __getattr__ below

__all__ = ["GuardError", "PolicyError", "__version__", "install", "status", "uninstall"]


def install(policy: "Policy | str | dict[str, Any] | None" = None) -> None:
    """Start guarding this process.

    ``policy`` is a path to a TOML file, the name of a shipped preset, a dict in the
    policy schema, or None to discover the policy as the auto-load does.
    """
    from autograd_guard._engine import engine as _engine

    _engine.install(policy)


def uninstall() -> None:
    """Stop guarding and restore every object that was patched."""
    from autograd_guard._engine import engine as _engine

    _engine.uninstall()


def status() -> "dict[str, Any]":
    """What is guarded, under which policy, and what the guards have done so far."""
    from autograd_guard._engine import engine as _engine

    return _engine.status()


def __getattr__(name: str) -> "Any":
    if name == "__version__":  # kept low in the package: start plans are keyed by it
        from autograd_guard._common import VERSION

        return VERSION
    if name in ("GuardError", "PolicyError"):
        from autograd_guard import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'autograd_guard' has no attribute {name!r}")


def __dir__() -> "list[str]":
    return sorted({*globals(), *__all__})
