"""Install the real third-party libraries that the guards protect into cached folders of
their own (``pip install --no-deps --target``), so that several versions can sit side by
side without touching the environment. Used by the tests and the benchmarks.

    python scripts/thirdparty.py pytorch3d    # prints the folder
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import wheelenv

CACHE = Path(
    os.environ.get(
        "AUTOGRAD_GUARD_TEST_CACHE",
        Path(__file__).resolve().parent.parent / ".cache" / "thirdparty",
    )
)

# name -> (pip requirements, extra environment, extra pip arguments)
PACKAGES: dict[str, tuple[list[str], dict[str, str], list[str]]] = {
    # Affected by NVIDIA/warp#394, and the newest (fixed) release, side by side.
    "warp-1.5.1": (["warp-lang==1.5.1"], {}, []),
    "warp-1.19.0": (["warp-lang==1.19.0"], {}, []),
    # A recorded wp.copy has a wrong adjoint in 1.16 (NVIDIA/warp#1728), fixed in 1.17.
    "warp-1.16.0": (["warp-lang==1.16.0"], {}, []),
    "warp-1.17.0": (["warp-lang==1.17.0"], {}, []),
    # Pure-Python wheel; it imports packaging without declaring it (installed with us).
    "gsplat": (["gsplat==1.5.3"], {}, []),
    # RoMa's rotvec_to_rotmat: 1.2.1 divides the rotation vector by its norm before the
    # small-angle branch (a NaN gradient at the identity); 1.3.0 is the fixed release.
    # Pure Python, torch only.
    "roma-1.2.1": (["roma==1.2.1"], {}, []),
    "roma-1.3.0": (["roma==1.3.0"], {}, []),
    # RoMa's newest release: its procrustes is a torch.autograd.Function with a
    # hand-written SVD backward (setup_context, custom_fwd, a vmap rule): grad_audit's
    # clean corpus of real differentiable geometry.
    "roma-1.6.0": (["roma==1.6.0"], {}, []),
    # POT (Python Optimal Transport): gromov_wasserstein2's kl_loss gradient has a term of
    # the wrong sign in 0.8.0 to 0.9.3 (PythonOT/POT#610), fixed in 0.9.4; 0.9.7.post1 is
    # the newest. Compiled against NumPy: 0.9.3's wheels need NumPy 1 (its folder brings
    # its own, shadowing the host's in that child only). No cp313 wheel below 0.9.5; SciPy
    # 1.15 has wheels for every Python of the matrix.
    "pot-0.9.3": (["pot==0.9.3", "numpy==1.26.4", "scipy==1.13.1"], {}, ["--only-binary", ":all:"]),
    "pot-0.9.4": (["pot==0.9.4", "scipy==1.15.3"], {}, ["--only-binary", ":all:"]),
    "pot-0.9.7": (["pot==0.9.7.post1", "scipy==1.15.3"], {}, ["--only-binary", ":all:"]),
    # PyTorch3D's real Python code without its compiled extension.
    "pytorch3d": (
        ["easypytorch3d==0.7.9.post1"],
        {"PYTORCH3D_NO_EXTENSION": "1"},
        ["--no-build-isolation", "--no-binary", "easypytorch3d"],
    ),
    # Training libraries whose optimizers and loops grad_health must skip steps in. Each
    # comes with its own dependencies, pinned, but never torch, numpy, or what every torch
    # install already has (typing-extensions, fsspec, filelock) or the guard needs
    # (packaging): those come from the host. PyYAML's compiled part is for the installing
    # Python; on another, PyYAML falls back to its pure-Python code on its own.
    "pytorch_optimizer": (["pytorch_optimizer==4.1.0"], {}, []),
    # huggingface_hub is left out: accelerate imports it only to save a model or in its
    # CLI, and it would bring an HTTP stack (httpx2, hf-xet, click) with it.
    "accelerate": (
        ["accelerate==1.15.0", "psutil==7.2.2", "PyYAML==6.0.3", "safetensors==0.8.0"],
        {},
        [],
    ),
    # The unified package holds lightning.pytorch and lightning.fabric itself; the
    # pytorch-lightning it also declares is the same code under the old name.
    "lightning": (
        [
            "lightning==2.6.6",
            "lightning-utilities==0.15.3",
            "torchmetrics==1.9.0",
            "tqdm==4.70.1",
            "PyYAML==6.0.3",
        ],
        {},
        [],
    ),
}


# Wheels of compiled code, for the installing interpreter: a folder per Python version.
PER_PYTHON = frozenset({"pot-0.9.3", "pot-0.9.4", "pot-0.9.7"})


def install(name: str) -> Path:
    """The folder holding ``name``, installed on first use."""
    requirements, env, extra = PACKAGES[name]
    folder = CACHE / name
    if name in PER_PYTHON:
        folder = CACHE / f"{name}-py{sys.version_info.major}.{sys.version_info.minor}"
    marker = folder / ".complete"
    if not marker.exists():
        wheelenv.pip_install_target(folder, *extra, *requirements, env={**os.environ, **env})
        marker.write_text(" ".join(requirements))
    return folder


def first_on_path(folder: str | Path) -> str:
    """``PYTHONPATH`` for a child with ``folder`` first, then the caller's own entries (the
    package under test, and what it needs, may come from them)."""
    return os.pathsep.join(filter(None, (str(folder), os.environ.get("PYTHONPATH"))))


# "installed": use the environment's own PyTorch3D, compiled extension included (the nox
# session of PyTorch3D's wheel sets it); unset: the cached copy of its Python code.
PYTORCH3D_ENV = "AUTOGRAD_GUARD_TEST_PYTORCH3D"
COMPILED_OPS = ("face_areas_normals_forward", "rasterize_meshes")  # what the stand-in lacks


def import_pytorch3d() -> types.ModuleType:
    """Import the real PyTorch3D: the environment's own, compiled ``pytorch3d._C`` and all,
    where ``AUTOGRAD_GUARD_TEST_PYTORCH3D=installed`` (an ImportError there if it is
    missing or does not load), else its Python code with a stand-in for the extension.

    Stand-in: ``pytorch3d._C`` is the C++/CUDA extension, which cannot be built here;
    ``taubin_smoothing``, ``Meshes`` and ``ico_sphere`` only read these constants from it.
    It is an attribute of the package, never in ``sys.modules``, so that
    ``pytest.importorskip("pytorch3d._C")`` skips where only the stand-in is there (each
    PyTorch3D module reads it with ``from pytorch3d import _C``).
    """
    if os.environ.get(PYTORCH3D_ENV) == "installed":
        return _import_installed_pytorch3d()
    folder = str(install("pytorch3d"))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import warnings

    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    import pytorch3d

    if getattr(pytorch3d, "_C", None) is None:
        stand_in = types.ModuleType("pytorch3d._C")
        stand_in.MAX_INT = 2147483647  # type: ignore[attr-defined]
        stand_in.MAX_UINT = 4294967295  # type: ignore[attr-defined]
        stand_in.MAX_USHORT = 65535  # type: ignore[attr-defined]
        stand_in.EPS = 1e-6  # type: ignore[attr-defined]
        pytorch3d._C = stand_in  # type: ignore[attr-defined]
    return pytorch3d


def _import_installed_pytorch3d() -> types.ModuleType:
    import importlib

    try:
        compiled = importlib.import_module("pytorch3d._C")
    except ImportError as exc:
        raise ImportError(
            f"{PYTORCH3D_ENV}=installed, but PyTorch3D's compiled pytorch3d._C does not "
            f"load in {sys.executable}: {exc} (easypytorch3d 0.7.9.post1's wheel loads with "
            "torch 2.11 and 2.12 only)"
        ) from exc
    missing = [name for name in COMPILED_OPS if not hasattr(compiled, name)]
    if missing:
        raise ImportError(f"pytorch3d._C ({compiled.__file__}) lacks {', '.join(missing)}")
    import pytorch3d

    return pytorch3d


def compiled_pytorch3d() -> bool:
    """The real compiled ``pytorch3d._C`` is loaded (not the stand-in)."""
    compiled = getattr(sys.modules.get("pytorch3d"), "_C", None)
    return all(hasattr(compiled, name) for name in COMPILED_OPS)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(install(arg))
