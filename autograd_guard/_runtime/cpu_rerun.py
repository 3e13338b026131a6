"""The cross-check of ``ipex_xpu``: re-run a module on a CPU copy of itself and measure
how far two outputs differ."""

from __future__ import annotations

import _thread
import sys

from autograd_guard._common.call import iter_tensors, map_tensors

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

_reference = _thread._local()  # threading would cost start-up time


def in_reference_run() -> bool:
    """True while the cross-check re-runs a module on the CPU."""
    return getattr(_reference, "active", False)


def rerun_on_cpu(torch: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """What a CPU copy of ``module`` returns for detached CPU copies of the arguments."""
    import copy

    _reference.active = True
    try:
        with torch.no_grad():
            reference = copy.deepcopy(module).to("cpu")
            cpu_args, cpu_kwargs = map_tensors(
                (args, kwargs), torch.Tensor, _detached_on_cpu, DEPTH
            )
            return reference(*cpu_args, **cpu_kwargs)
    finally:
        _reference.active = False


DEPTH = 8  # how deep model inputs and outputs are searched for tensors


def tensors(value: Any) -> Iterable[Any]:
    """The tensors in a model's inputs or outputs."""
    return iter_tensors(value, sys.modules["torch"].Tensor, DEPTH)


def _detached_on_cpu(tensor: Any) -> Any:
    return tensor.detach().cpu()


def max_differences(actual: Any, expected: Any) -> tuple[float, float]:
    """Largest absolute and relative difference over every tensor in two outputs."""
    worst_abs = worst_rel = 0.0
    pairs = zip(tensors(_as_plain(actual)), tensors(_as_plain(expected)), strict=False)
    for got, want in pairs:
        if not (got.is_floating_point() and got.shape == want.shape):
            continue
        diff = (got.detach().cpu().double() - want.double()).abs()
        if diff.numel():
            worst_abs = max(worst_abs, float(diff.max()))
            scale = want.double().abs().clamp_min(1e-12)
            worst_rel = max(worst_rel, float((diff / scale).max()))
    return worst_abs, worst_rel


def _as_plain(value: Any) -> Any:
    """transformers' ModelOutput becomes a tuple of its tensors."""
    if hasattr(value, "to_tuple"):
        return value.to_tuple()
    return value
