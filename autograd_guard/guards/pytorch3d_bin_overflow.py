"""Guard ``pytorch3d_bin_overflow``: coarse-to-fine rasterization on CUDA drops faces
(or points) when a bin overflows.

Symptom: on CUDA, ``rasterize_meshes`` and ``rasterize_points`` bin the image
(``bin_size`` > 0 is the default there: 8 to 128 pixels) and keep at most
``max_faces_per_bin`` (default ``max(10000, F / 5)``) / ``max_points_per_bin`` elements
per bin. A dense mesh small on screen puts more faces than that into one bin: the CUDA
coarse kernel then skips the faces that do not fit, the image has holes or missing
parts, and the only sign is a device ``printf`` ("Bin size was too small in the coarse
rasterization phase. This caused an overflow, meaning output may be incomplete...") on
the process's stdout, invisible in notebooks and logs. Before 0.6.2 the kernel wrote
past the end of its buffer instead. On the CPU nothing is dropped: binning is only used
when asked for (``bin_size`` > 0), and it raises ("Got too many faces per bin", else
"NOT IMPLEMENTED" from the fine step), so CPU calls are left alone.
Affected: every PyTorch3D version (the kernel is unchanged at HEAD).
Upstream: facebookresearch/pytorch3d#348, #1064 (and many downstream reports).
Remedy: before each binned CUDA call, the guard counts the elements per bin exactly as
the coarse kernel bins them (bounding boxes, blur radius or point radius, the skip of
elements behind the camera); where a bin would overflow it passes a
``max_faces_per_bin`` / ``max_points_per_bin`` that fits (``retry = "max_per_bin"``,
the default, falling back to naive rasterization where that buffer would exceed
``max_buffer_bytes``) or ``bin_size=0`` (``retry = "naive"``). Logged once per call
site; ``observe`` lets the faces drop, ``strict`` raises before the call.
"""

from __future__ import annotations

import sys

from autograd_guard.guard import Call, Guard, Option, Target

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

K_EPSILON = 1e-8  # pytorch3d/csrc/utils/geometry_utils.cuh: faces nearer are skipped


class Layout:
    """Where ``_C.rasterize_meshes`` / ``_C.rasterize_points`` take what the count needs."""

    def __init__(self, kind: str, image: int, size: int, bins: int) -> None:
        self.kind, self.image, self.size, self.bins = kind, image, size, bins

    @staticmethod
    def of(target: str, nargs: int) -> Layout:
        if target == "rasterize_points":  # points, first, per cloud, image, radius, K, bin, max
            return Layout("points", 3, 4, 6)
        # face_verts, first, per mesh, [clipped neighbours (0.4+)], image, blur, K, bin, max, ...
        return Layout("faces", 4, 5, 7) if nargs >= 12 else Layout("faces", 3, 4, 6)


def drops_silently(tensor: Any) -> bool:
    """The CUDA kernel drops what overflows (the CPU one raises)."""
    return bool(tensor.is_cuda)


class PyTorch3DBinOverflow(Guard):
    name = "pytorch3d_bin_overflow"
    distribution = ("pytorch3d", "easypytorch3d")
    affected = ""  # every version
    symptom = "coarse rasterization on CUDA drops the faces/points of an overflowing bin"
    upstream = "https://github.com/facebookresearch/pytorch3d/issues/348"
    remedy = (
        "raise max_faces_per_bin / max_points_per_bin above the most elements in one bin, "
        "or set bin_size=0 (naive rasterization) in the raster settings"
    )
    targets = (
        Target("pytorch3d._C", "rasterize_meshes", check="binned"),
        Target("pytorch3d._C", "rasterize_points", check="binned"),
    )
    options = {
        "retry": Option(
            str,
            "max_per_bin",
            "max_per_bin: a bin capacity that fits; naive: bin_size=0",
            choices=("max_per_bin", "naive"),
        ),
        "max_buffer_bytes": Option(
            int, 1 << 30, "above this, the bin buffer max_per_bin needs: naive instead"
        ),
    }

    def _needed(self) -> bool:
        # Only the compiled extension has these functions: an extension module imported
        # without them (a stand-in for PyTorch3D's Python code alone) has nothing to wrap.
        extension = sys.modules.get("pytorch3d._C")
        return self.is_affected() and (extension is None or hasattr(extension, "rasterize_meshes"))

    def binned(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Coarse-to-fine on CUDA: ``bin_size`` and the bin capacity both positive (the
        library passes every argument by position)."""
        bins = 6 if len(args) in (8, 11) else 7
        return (
            len(args) > bins + 1
            and args[bins] > 0
            and args[bins + 1] > 0
            and drops_silently(args[0])
        )

    def handle(self, call: Call) -> Any:
        layout = Layout.of(call.target.qualname, len(call.args))
        most = most_in_one_bin(call.args, layout)
        if most <= call.args[layout.bins + 1]:
            return call.proceed()
        args = self._retry_args(call.args, layout, most)
        if not self._report(call, layout, most, args):
            return call.proceed()
        return call.proceed(args)

    def _retry_args(self, args: tuple[Any, ...], layout: Layout, most: int) -> tuple[Any, ...]:
        if self.config["retry"] == "max_per_bin":
            buffer = buffer_bytes(args, layout, most)
            if buffer <= self.config["max_buffer_bytes"]:
                return _with(args, layout, args[layout.bins], most)
        return _with(args, layout, 0, None)

    def _report(self, call: Call, layout: Layout, most: int, args: tuple[Any, ...]) -> bool:
        element, capacity, bin_size = layout.kind, call.args[layout.bins + 1], args[layout.bins]
        retry = "bin_size=0" if bin_size == 0 else f"max_{element}_per_bin={args[layout.bins + 1]}"
        return self.report(
            call,
            "bin_overflow",
            f"coarse rasterization would overflow a bin on CUDA and drop {element} from the "
            f"image ({most} {element} in one bin, max_{element}_per_bin={capacity}, "
            f"bin_size={call.args[layout.bins]}): rasterized with {retry} instead",
            element=element,
            most_in_one_bin=most,
            max_per_bin=capacity,
            bin_size=call.args[layout.bins],
            retry=retry,
            device=str(call.args[0].device),
        )


def _with(
    args: tuple[Any, ...], layout: Layout, bin_size: int, capacity: int | None
) -> tuple[Any, ...]:
    changed = list(args)
    changed[layout.bins] = bin_size
    if capacity is not None:
        changed[layout.bins + 1] = capacity
    return tuple(changed)


# -- the coarse kernel's binning (pytorch3d/csrc/rasterize_coarse/rasterize_coarse.cu) --


def bins_along(size: int, other: int, bin_size: int) -> tuple[Any, Any]:
    """The NDC extent of each bin along an image side of ``size`` pixels, in float32 as
    the kernel computes it (``PixToNonSquareNdc`` of the bin's first and last pixel,
    widened by half a pixel)."""
    import torch

    def f32(value: Any) -> Any:
        return torch.tensor(value, dtype=torch.float32)

    ndc_range = f32(2.0) if size <= other else f32(size) * 2.0 / other
    offset = ndc_range / 2.0
    half_pixel = offset / size
    count = 1 + (size - 1) // bin_size
    first = torch.arange(count, dtype=torch.float32) * bin_size
    last = first + (bin_size - 1)
    low = -offset + (ndc_range * first + offset) / size - half_pixel
    high = -offset + (ndc_range * last + offset) / size + half_pixel
    return low, high


def most_in_one_bin(args: tuple[Any, ...], layout: Layout) -> int:
    """The most elements any bin of any image in the batch receives, counted on the
    elements' device with one sync (the final read): each element covers a rectangle of
    bins, added per mesh into a 2-D difference array whose running sums are the counts."""
    import torch

    elements = args[0].detach()
    device = elements.device
    low, high, skip = _bounding_boxes(elements, args[layout.size], layout.kind)
    height, width = (int(side) for side in args[layout.image])
    bin_size = int(args[layout.bins])
    y_low, y_high = _edges(height, width, bin_size, device)
    x_low, x_high = _edges(width, height, bin_size, device)
    y0, y1 = _covered(low[:, 1], high[:, 1], y_low, y_high)
    x0, x1 = _covered(low[:, 0], high[:, 0], x_low, x_high)
    index = torch.arange(len(elements), device=device)[:, None]
    first, count = args[1].to(device)[None], args[2].to(device)[None]
    binned = ~skip & (y0 < y1) & (x0 < x1)  # in front of the camera, on some bin
    weight = ((index >= first) & (index < first + count) & binned[:, None]).to(torch.int32)
    columns = len(x_low) + 1  # the bins along x, and one past the last
    counts = torch.zeros(
        (len(y_low) + 1) * columns, weight.shape[1], dtype=torch.int32, device=device
    )
    for y, x, sign in ((y0, x0, 1), (y0, x1, -1), (y1, x0, -1), (y1, x1, 1)):
        counts.index_add_(0, y * columns + x, weight, alpha=sign)
    per_bin = counts.view(-1, columns, weight.shape[1]).cumsum(0).cumsum(1)
    return int(per_bin.max().item()) if per_bin.numel() else 0


def _covered(low: Any, high: Any, bin_low: Any, bin_high: Any) -> tuple[Any, Any]:
    """The bins ``[start, stop)`` an element spanning ``[low, high)`` lands in, as the
    kernel tests them (``low <= bin_high`` and ``bin_low < high``); none for NaN."""
    import torch

    low, high = low.contiguous(), high.contiguous()
    start = torch.searchsorted(bin_high, low)  # the first bin with low <= bin_high
    stop = torch.searchsorted(bin_low, high)  # the first bin with high <= bin_low
    nan = low.isnan() | high.isnan()
    return start, torch.where(nan, start, stop)


# Each side's bin extents on a device, by (size, other side, bin_size, device): a render
# loop asks for the same ones every call, and a copy to the device waits for it.
_EDGES: dict[tuple[int, int, int, Any], tuple[Any, Any]] = {}


def _edges(size: int, other: int, bin_size: int, device: Any) -> tuple[Any, Any]:
    key = (size, other, bin_size, device)
    edges = _EDGES.get(key)
    if edges is None:
        if len(_EDGES) >= 64:
            _EDGES.clear()
        low, high = bins_along(size, other, bin_size)
        edges = _EDGES[key] = (low.to(device), high.to(device))
    return edges


def _bounding_boxes(elements: Any, size: Any, kind: str) -> tuple[Any, Any, Any]:
    """(E, 2) lower and upper x/y corners and the (E,) skip flags, as the kernel's
    ``TriangleBoundingBoxKernel`` / ``PointBoundingBoxKernel`` compute them."""
    import torch

    if kind == "faces":
        sqrt_blur = torch.tensor(float(size), dtype=torch.float32).sqrt().item()
        xy = elements[..., :2].float()
        skip = elements[:, :, 2].float().amin(1) < K_EPSILON
        return xy.amin(1) - sqrt_blur, xy.amax(1) + sqrt_blur, skip
    reach = size.float()[:, None] if isinstance(size, torch.Tensor) else float(size)
    xy = elements[:, :2].float()
    return xy - reach, xy + reach, elements[:, 2] < 0


def buffer_bytes(args: tuple[Any, ...], layout: Layout, capacity: int) -> int:
    """The size of the (N, bins_y, bins_x, capacity) int32 buffer the kernel allocates."""
    height, width = (int(side) for side in args[layout.image])
    bin_size = int(args[layout.bins])
    bins = (1 + (height - 1) // bin_size) * (1 + (width - 1) // bin_size)
    return len(args[2]) * bins * capacity * 4


GUARD = PyTorch3DBinOverflow
