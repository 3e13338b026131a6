"""``load()``: find, read and validate the policy (``_policy.files`` and ``_policy.schema``)
into the plain data of ``_policy.data``, re-exported here."""

from __future__ import annotations

import os

from autograd_guard._common.environment import MODES
from autograd_guard._policy.data import GuardSettings, Policy, Rule
from autograd_guard.errors import Problems

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from autograd_guard._policy.options import GuardOptions

__all__ = ["MODES", "GuardSettings", "Policy", "Rule", "load"]


def load(
    source: str | Mapping[str, Any] | None,
    guards: Iterable[type[GuardOptions]],
    environ: Mapping[str, str] | None = None,
    cwd: str | None = None,
    problems: Problems | None = None,
    program: str | None = None,
) -> Policy:
    """Load and validate a policy, then apply the environment's overrides.

    Raises PolicyError naming every problem found (``PolicyErrors`` for several); with
    ``problems``, adds them there and returns what could be read (for ``check``). A file
    that cannot be found, read or parsed is raised either way. ``program``: the program's
    own folder, where discovery looks first (see ``_policy.files.discover``).
    """
    from autograd_guard._policy import files as _policy_files
    from autograd_guard._policy import schema as _policy_schema

    environ = os.environ if environ is None else environ
    guard_list = list(guards)
    found_problems = Problems() if problems is None else problems
    files: list[str] = []  # what a start plan depends on (see _boot.plan)
    why = "given to install()"
    if isinstance(source, dict):
        policy = _policy_schema.build("<dict>", dict(source), guard_list, found_problems, files)
    else:
        if source is None:
            found = _policy_files.discover(environ, cwd or os.getcwd(), None, program)
        else:
            found = _policy_files.resolve_named(str(source), "policy", cwd)
        folder = os.path.dirname(found.path)
        why = found.why or f"named as {source!r}"
        data = found.read(files)
        policy = _policy_schema.build(
            found.description, data, guard_list, found_problems, files, 0, folder
        )
    names = [g.name for g in guard_list]
    _policy_schema.apply_environment(policy, environ, names, found_problems)
    if problems is None:
        found_problems.raise_if_any()
    policy.files = files
    policy.why = why
    return policy
