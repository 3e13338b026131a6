"""Guard ``ipex_xpu``: Intel Extension for PyTorch diverges from the CPU in inference.

Symptom: TripoSR on an Intel GPU (XPU) with IPEX 2.1.10+xpu produced distorted meshes
while the CPU output was right (intel/intel-extension-for-pytorch#579). Its image
tokenizer (a transformers ViT called with ``interpolate_pos_encoding=True``) hits two
differences: dropout modules left in training mode (TripoSR never calls ``.eval()``),
and ``F.interpolate(mode="bicubic", scale_factor=...)``, whose ``scale_factor`` the XPU
kernel ignored before 2.1.30 (IPEX #3759, #3892).
Affected: intel-extension-for-pytorch below 2.1.30 (``2.1.20+xpu`` included).
Upstream: intel/intel-extension-for-pytorch#579.
Remedy: on the affected devices, a training-mode dropout under no_grad or inference mode
is the identity (the inference of a model never put in eval mode), and bicubic
interpolation with a scale factor is computed on the CPU and moved back. Opt-in: every
Nth forward of the listed classes is re-run on a CPU copy and compared. Nothing is
patched until IPEX itself is imported.
"""

from __future__ import annotations

import sys

from autograd_guard._runtime.cpu_rerun import (
    in_reference_run,
    max_differences,
    rerun_on_cpu,
    tensors,
)
from autograd_guard.guard import Call, Guard, Option, Target, remedy_report, traceable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

IPEX = "intel_extension_for_pytorch"
# The dropout functions, by their ``training`` default (the same in every torch).
DROPOUTS = ("dropout", "dropout1d", "dropout2d", "dropout3d")
DROPOUTS_OFF_BY_DEFAULT = ("alpha_dropout", "feature_alpha_dropout")


class IpexXpu(Guard):
    name = "ipex_xpu"
    distribution = "intel-extension-for-pytorch"
    affected = "<2.1.30"
    symptom = "XPU inference diverges from CPU: training-mode dropout, bicubic scale_factor"
    upstream = "https://github.com/intel/intel-extension-for-pytorch/issues/579"
    remedy = (
        "upgrade intel-extension-for-pytorch to 2.1.30 or later, and call model.eval() "
        "before inference"
    )
    options = {
        "devices": Option(list, ["xpu"], "device types treated as affected"),
        "dropout": Option(bool, True, "training-mode dropout in inference is the identity"),
        "bicubic": Option(bool, True, "bicubic interpolation with a scale factor on the CPU"),
        "crosscheck": Option(list, [], "module:Class names re-run on a CPU copy"),
        "crosscheck_every": Option(
            int, 10, "re-run every Nth forward", minimum=1, maximum=1_000_000
        ),
        "crosscheck_max": Option(int, 5, "re-runs per class at most", minimum=0, maximum=1_000_000),
        "crosscheck_atol": Option(float, 1e-4, "absolute tolerance", minimum=0.0),
        "crosscheck_rtol": Option(float, 1e-3, "relative tolerance", minimum=0.0),
    }

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._devices = frozenset(self.config["devices"])
        self._forwards: dict[str, int] = {}
        self._checks: dict[str, int] = {}

    def _targets_to_wrap(self) -> Iterable[Target]:
        targets = []
        if self.config["dropout"]:
            remedy = {"handle": "_dropout", "traced": "_traced_dropout"}
            targets += [
                Target("torch.nn.functional", name, after=IPEX, check="_dropout_check", **remedy)
                for name in DROPOUTS
            ]
            targets += [
                Target("torch.nn.functional", name, after=IPEX, check="_alpha_check", **remedy)
                for name in DROPOUTS_OFF_BY_DEFAULT
            ]
        if self.config["bicubic"]:
            targets.append(
                Target(
                    "torch.nn.functional",
                    "interpolate",
                    after=IPEX,
                    check="_bicubic_check",
                    handle="_bicubic",
                    traced="_traced_bicubic",
                )
            )
        for name in self.config["crosscheck"]:
            module, _, cls = name.partition(":")
            # Called through torch's Module.__call__: the call site is the model's caller.
            # Not traced: the re-run is eager (a graph break under torch.compile).
            targets.append(
                Target(
                    module,
                    f"{cls}.forward",
                    after=IPEX,
                    skip=("torch",),
                    check="_forward_check",
                    handle="_crosscheck",
                )
            )
        return targets

    def _on_device(self, tensor: Any) -> bool:
        device = getattr(tensor, "device", None)
        return device is not None and device.type in self._devices and not in_reference_run()

    # -- under torch.compile ----------------------------------------------------------

    def _traceable_state(self, original: Callable[..., Any]) -> dict[str, Any]:
        return {
            "torch": sys.modules["torch"],
            "original": original,
            "devices": tuple(self._devices),
            "fix": self.mode == "fix",
        }

    # -- dropout ---------------------------------------------------------------------

    def _alpha_check(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if "training" not in kwargs and len(args) < 3:
            return False  # training defaults to False here
        return self._dropout_check(instance, args, kwargs)

    def _dropout_check(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        training = kwargs.get("training", args[2] if len(args) > 2 else True)
        if not training:
            return False
        torch = sys.modules["torch"]
        inference = not torch.is_grad_enabled() or torch.is_inference_mode_enabled()
        return inference and self._on_device(kwargs.get("input", args[0] if args else None))

    def _dropout(self, call: Call) -> Any:
        tensor = call.argument("input", 0)
        if self.report(
            call,
            "dropout_identity",
            f"{call.target.qualname}(training=True) in inference on "
            f"{tensor.device.type}: dropout skipped; call model.eval()",
            p=call.argument("p", 1, 0.5),
        ):
            return tensor
        return call.proceed()

    def _traced_dropout(
        self, target: Target, original: Callable[..., Any]
    ) -> Callable[..., Any] | None:
        what = "dropout skipped in inference"
        report = remedy_report(self, target, "dropout_identity", what)
        default = target.qualname not in DROPOUTS_OFF_BY_DEFAULT
        state = self._traceable_state(original)
        return traceable(_dropout_traced, report=report, default=default, **state)

    # -- bicubic -----------------------------------------------------------------------

    def _bicubic_check(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        mode = kwargs.get("mode", args[3] if len(args) > 3 else "nearest")
        scale = kwargs.get("scale_factor", args[2] if len(args) > 2 else None)
        return (
            mode == "bicubic"
            and scale is not None
            and self._on_device(kwargs.get("input", args[0] if args else None))
        )

    def _bicubic(self, call: Call) -> Any:
        tensor = call.argument("input", 0)
        if not self.report(
            call,
            "bicubic_on_cpu",
            f"bicubic interpolation with scale_factor on {tensor.device.type}: computed on the CPU",
            shape=list(tensor.shape),
        ):
            return call.proceed()
        call.replace("input", 0, tensor.cpu())
        return call.proceed().to(tensor.device)

    def _traced_bicubic(
        self, target: Target, original: Callable[..., Any]
    ) -> Callable[..., Any] | None:
        what = "bicubic computed on the CPU"
        report = remedy_report(self, target, "bicubic_on_cpu", what)
        return traceable(_interpolate_traced, report=report, **self._traceable_state(original))

    # -- cross-check ---------------------------------------------------------------------

    def _forward_check(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if instance is None or in_reference_run():
            return False
        name = type(instance).__qualname__
        count = self._forwards[name] = self._forwards.get(name, 0) + 1
        return (
            count % self.config["crosscheck_every"] == 0
            and self._checks.get(name, 0) < self.config["crosscheck_max"]
            and any(self._on_device(t) for t in tensors((args, kwargs)))
        )

    def _crosscheck(self, call: Call) -> Any:
        torch = sys.modules["torch"]
        result = call.proceed()
        name = type(call.instance).__qualname__
        self._checks[name] = self._checks.get(name, 0) + 1
        expected = rerun_on_cpu(torch, call.instance, call.args, call.kwargs)
        abs_diff, rel_diff = max_differences(result, expected)
        atol, rtol = self.config["crosscheck_atol"], self.config["crosscheck_rtol"]
        diverged = abs_diff > atol and rel_diff > rtol
        event = (
            f"{name} on the device diverges from a CPU re-run (max abs diff {abs_diff:.3g})"
            if diverged
            else f"{name} on the device matches a CPU re-run"
        )
        fields = {
            "max_abs_diff": abs_diff,
            "max_rel_diff": rel_diff,
            "atol": atol,
            "rtol": rtol,
            "check": self._checks[name],
        }
        if diverged:
            self.report(call, "crosscheck", event, **fields)
        else:
            self.emit(
                event,
                action="crosscheck",
                callsite=call.callsite,
                target=str(call.target),
                level="info",
                **fields,
            )
        return result


compiled: Any = None  # the state of each traceable copy of the two functions below


def _dropout_traced(*args: Any, **kwargs: Any) -> Any:
    """What torch.compile traces in place of a dropout: the identity in inference."""
    training = kwargs.get("training", args[2] if len(args) > 2 else compiled.default)
    tensor: Any = kwargs.get("input", args[0] if args else None)
    inference = not compiled.torch.is_grad_enabled()
    if not (training and inference and tensor.device.type in compiled.devices):
        return compiled.original(*args, **kwargs)
    compiled.report()
    return tensor if compiled.fix else compiled.original(*args, **kwargs)


def _interpolate_traced(*args: Any, **kwargs: Any) -> Any:
    """What torch.compile traces in place of interpolate: bicubic on the CPU."""
    tensor: Any = kwargs.get("input", args[0] if args else None)
    mode = kwargs.get("mode", args[3] if len(args) > 3 else "nearest")
    scale = kwargs.get("scale_factor", args[2] if len(args) > 2 else None)
    if mode != "bicubic" or scale is None or tensor.device.type not in compiled.devices:
        return compiled.original(*args, **kwargs)
    compiled.report()
    if not compiled.fix:
        return compiled.original(*args, **kwargs)
    if "input" in kwargs:
        return compiled.original(*args, **{**kwargs, "input": tensor.cpu()}).to(tensor.device)
    return compiled.original(tensor.cpu(), *args[1:], **kwargs).to(tensor.device)


GUARD = IpexXpu
