"""The wheel as a PyPI project ships it (issue 21): the license, py.typed, classifiers,
project URLs and the supported Python and torch ranges, all agreeing with each other."""

from __future__ import annotations

import email
import sys
import zipfile

from helpers import ROOT

from autograd_guard._common import versions as _versions

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def wheel_contents(wheel):
    """The wheel's file names, its METADATA, and every file's bytes by name."""
    with zipfile.ZipFile(wheel) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    metadata = next(data for name, data in files.items() if name.endswith("/METADATA"))
    return list(files), email.message_from_bytes(metadata), files.__getitem__


def test_the_license_file_is_mit_in_the_repository_and_the_wheel(wheel):
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert PYPROJECT["license"] == "MIT" and text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the autograd-guard authors" in text
    names, metadata, read = wheel_contents(wheel)
    assert metadata["License-Expression"] == "MIT"
    [license_file] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert read(license_file).decode("utf-8") == text


def test_the_wheel_is_typed_and_says_what_it_supports(wheel):
    names, metadata, _ = wheel_contents(wheel)
    assert "autograd_guard/py.typed" in names
    classifiers = metadata.get_all("Classifier")
    assert "Typing :: Typed" in classifiers
    assert any(c.startswith("Development Status :: ") for c in classifiers)
    low, high = (int(v.split(".")[1]) for v in _versions.SUPPORTED_PYTHON)
    pythons = {c.rpartition(" :: ")[2] for c in classifiers if c.count(".") == 1 and "3." in c}
    assert pythons == {f"3.{minor}" for minor in range(low, high + 1)}
    assert metadata["Requires-Python"] == f">={_versions.SUPPORTED_PYTHON[0]}"
    low_torch, high_torch = _versions.SUPPORTED_TORCH
    major, minor = high_torch.split(".")
    torch_range = f"torch<{major}.{int(minor) + 1},>={low_torch}; extra == 'torch'"
    assert torch_range in metadata.get_all("Requires-Dist")
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL"))
    assert set(urls) == {"Homepage", "Source", "Issues", "Documentation", "Changelog"}
    assert all(
        u.startswith("https://github.com/autograd-guard/autograd-guard") for u in urls.values()
    )
