"""Build hook: make editable installs carry ``autograd_guard.pth`` too.

Hatchling leaves ``force-include`` files out of editable wheels, and installers differ in
what they keep (kvcached#470, uv#19258), so the auto-load would silently not happen
after ``pip install -e .``.
"""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name == "wheel" and version == "editable":
            build_data["force_include_editable"]["autograd_guard.pth"] = "autograd_guard.pth"
