"""Read installed versions from distribution metadata, never by importing the library."""

from __future__ import annotations

from autograd_guard._common import STATE

# What the version matrix (noxfile.py) tests: the oldest and newest of each.
SUPPORTED_PYTHON = ("3.10", "3.13")
SUPPORTED_TORCH = ("2.1", "2.15")


def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    cache = STATE.versions
    if distribution not in cache:
        from importlib import metadata

        try:
            cache[distribution] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            cache[distribution] = None
    return cache[distribution]


def first_installed(distributions: str | tuple[str, ...]) -> tuple[str, str | None]:
    """The first of ``distributions`` that is installed, with its version.

    A library can be published under several names (``pytorch3d``, ``easypytorch3d``).
    """
    names = (distributions,) if isinstance(distributions, str) else distributions
    for name in names:
        version = installed_version(name)
        if version is not None:
            return name, version
    return names[0], None


def is_affected(version: str | None, specifier: str) -> bool:
    """True when ``version`` falls in ``specifier``; local labels (``2.1.20+xpu``) count."""
    if version is None:
        return False
    if not specifier:
        return True
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        parsed = Version(version)
    except InvalidVersion:
        return False
    # Compare the public part: "2.1.20+xpu" must match "<2.1.30", which PEP 440 allows,
    # and prereleases of an affected line are affected too.
    return SpecifierSet(specifier).contains(Version(parsed.public), prereleases=True)


def clear_cache() -> None:
    STATE.versions.clear()


def support_note(python: str, torch: str | None) -> str:
    """Empty where ``python`` and ``torch`` are within the tested range, else a warning."""
    from packaging.version import Version

    def outside(version: str, bounds: tuple[str, str]) -> bool:
        release = Version(version).release[:2]
        low, high = (Version(bound).release for bound in bounds)
        return not low <= release <= high

    notes = []
    if outside(python, SUPPORTED_PYTHON):
        notes.append(f"Python {python}")
    if torch is not None and outside(torch, SUPPORTED_TORCH):
        notes.append(f"torch {torch}")
    if not notes:
        return ""
    return (
        f"untested: {' and '.join(notes)} (supported: Python {'-'.join(SUPPORTED_PYTHON)}, "
        f"torch {'-'.join(SUPPORTED_TORCH)})"
    )
