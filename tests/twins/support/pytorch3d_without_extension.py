"""Import this before PyTorch3D: a stand-in for its compiled extension ``pytorch3d._C``
(which cannot be built here), holding the constants that its Python code reads (as in
scripts/thirdparty.py)."""

import sys
import types
import warnings

if "pytorch3d._C" not in sys.modules:
    stand_in = types.ModuleType("pytorch3d._C")
    stand_in.MAX_INT = 2147483647
    stand_in.MAX_UINT = 4294967295
    stand_in.MAX_USHORT = 65535
    stand_in.EPS = 1e-6
    sys.modules["pytorch3d._C"] = stand_in
warnings.filterwarnings("ignore", message="Sparse invariant checks")
