"""grad_health's finiteness check of the gradients an optimizer is about to use.

One fused kernel per step where torch has one for the device (AMP's
``_amp_foreach_non_finite_check_and_unscale_`` with a scale of 1.0, which leaves the values
as they are), feature-detected once per device type: torch 2.1 has no CPU kernel. Without
it, one sum per gradient screens them (a non-finite value makes its sum non-finite) and an
exact ``isfinite`` confirms, since a sum of finite values can overflow.

The flag the kernel sets lives per thread and device: threads that train models of their
own never share one. A ``device_flag`` is a fresh flag per step, left on the device, for
a fused optimizer that skips the step itself (as under GradScaler), with no host sync.
"""

from __future__ import annotations

import sys
import threading

from autograd_guard.guards.grad_health.forward import attribute_tensors

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Device types where a fused optimizer's step takes the flag without a host sync. The CPU
# is left out (a read costs nothing there); tests add it to run this path on the CPU.
DEFERRED_DEVICE_TYPES = {"cuda"}

# A rank's word in a group's exchange (``dist.Sharing.exchange``), read by ``zero`` too
NO_GRADIENTS, SOME_VALUE, ALL_ZERO = 0.0, 1.0, 2.0


class Slot:
    """One thread's flags for one device, and what the device allows."""

    __slots__ = ("cuda", "deferred", "found", "kernel", "one")

    def __init__(self, torch: Any, device: Any, kernel: bool) -> None:
        self.cuda = device.type == "cuda"
        self.deferred = device.type in DEFERRED_DEVICE_TYPES and kernel
        self.kernel = kernel  # AMP's kernel runs on this device type
        self.found: Any = torch.zeros(1, device=device) if kernel else None  # 0 when healthy
        self.one: Any = torch.ones(1, device=device) if kernel else None


class FiniteCheck:
    """Whether gradients are all finite, with flags of each thread's own."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._kernel_works: dict[str, bool] = {}  # device type -> AMP's kernel runs there

    def slot(self, device: Any) -> Slot:
        slots = self._local.__dict__.get("slots")
        if slots is None:
            slots = self._local.slots = {}
        slot = slots.get(device)
        if slot is None:
            torch = sys.modules["torch"]
            slot = Slot(torch, device, self._kernel(torch, device))
            if slot.found is None or type(slot.found) is torch.Tensor:  # not in a fake mode
                slots[device] = slot
        return slot

    def all_finite(
        self, grads: list[Any], slot: Slot | None = None, probe: Probe | None = None
    ) -> bool:
        """One sync per device. Meta and fake tensors hold no values: they pass. A
        ``probe`` of one gradient is read with the flag where that saves a sync."""
        torch = sys.modules["torch"]
        first = grads[0]
        if type(first) is torch.Tensor:  # not a subclass (fake tensors and the like)
            slot = slot or self.slot(first.device)
        if slot is not None and slot.kernel:
            try:
                return _fused(torch, grads, slot, probe)
            except (RuntimeError, TypeError):  # several devices, sparse or complex gradients
                pass
        by_device: dict[Any, list[Any]] = {}
        for grad in grads:
            values = grad._values() if grad.is_sparse else grad
            values = torch.view_as_real(values.resolve_conj()) if values.is_complex() else values
            by_device.setdefault(values.device, []).append(values)
        return all(self._group_finite(torch, group) for group in by_device.values())

    def device_flag(self, grads: list[Any], slot: Slot) -> Any:
        """A new 0-dim tensor (as GradScaler lends) on the gradients' device, 1.0 where any
        is not finite; None where this cannot be had without a sync (no kernel, several
        devices)."""
        torch = sys.modules["torch"]
        first = grads[0]
        if not slot.deferred or type(first) is not torch.Tensor:
            return None
        if slot.cuda and torch.cuda.is_current_stream_capturing():
            return None
        found = torch.zeros((), device=first.device)  # fresh: read while the next step runs
        try:
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, slot.one)
        except (RuntimeError, TypeError):
            return None
        return found

    def _group_finite(self, torch: Any, group: list[Any]) -> bool:
        device = group[0].device
        if device.type == "meta" or _fake(group[0]):
            return True  # no values to check; the optimizer says what it makes of them
        slot = self.slot(device)
        if slot.kernel:
            try:
                return _fused(torch, group, slot)
            except (RuntimeError, TypeError):
                pass
        sums = torch.stack([gradient_sum(torch, g).float() for g in group])
        if bool(sums.isfinite().all()):
            return True
        return all(bool(g.isfinite().all()) for g in group)

    def _kernel(self, torch: Any, device: Any) -> bool:
        """AMP's kernel runs on this device type (feature-detected once)."""
        works = self._kernel_works.get(device.type)
        if works is None:
            works = False
            if device.type != "meta":
                probe = [torch.zeros(1, device=device)]
                if type(probe[0]) is not torch.Tensor:
                    return False  # a fake mode is on: ask again outside it
                try:
                    torch._amp_foreach_non_finite_check_and_unscale_(
                        probe, torch.zeros(1, device=device), torch.ones(1, device=device)
                    )
                    works = True
                except (NotImplementedError, RuntimeError, AttributeError):
                    pass
            self._kernel_works[device.type] = works
        return works


def _fused(torch: Any, grads: list[Any], slot: Slot, probe: Probe | None = None) -> bool:
    if slot.cuda and torch.cuda.is_current_stream_capturing():
        return True  # no sync is allowed inside a CUDA graph capture
    found = slot.found
    try:
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, slot.one)
    except BaseException:
        found.zero_()  # a kernel stopped midway may have set it
        raise
    if probe is not None and probe.flag is not None and slot.cuda:  # one sync for both
        bad, nonzero = torch.cat((found, probe.flag.reshape(1).to(found.dtype))).tolist()
        probe.nonzero = bool(nonzero)
    else:
        bad = found.item()
    if not bad:
        return True
    found.zero_()
    return False


class Probe:
    """Whether one gradient of a step holds a value other than zero: a flag on its device,
    read with the finite check's flag (one sync on CUDA) or on its own; a gradient of one
    value on the CPU is read at once (no kernel: ~5 us less in a short CPU step)."""

    __slots__ = ("flag", "nonzero")

    def __init__(self, grad: Any) -> None:
        torch = sys.modules["torch"]
        self.nonzero: bool | None = None
        self.flag: Any = None
        if grad.is_cpu and grad.numel() == 1 and grad.layout == torch.strided:
            self.nonzero = grad.item() != 0  # one value on the host: read, no kernel
        else:
            self.flag = torch.count_nonzero(gradient_values(torch, grad))  # faster than any()

    def read(self) -> bool:
        if self.nonzero is None:
            self.nonzero = bool(self.flag)
        return self.nonzero


def gradient_values(torch: Any, grad: Any) -> Any:
    """A gradient's values as a real dense-or-values tensor, detached (a sparse gradient's
    stored values; a complex one's real view)."""
    values = grad._values() if grad.is_sparse else grad
    values = values.detach()
    if values.is_complex():
        values = torch.view_as_real(values.resolve_conj())
    return values


def gradient_sum(torch: Any, grad: Any) -> Any:
    """A sum, not finite when ``grad`` is not (or, for finite values, when it passes 3e38):
    one read of the tensor, several times cheaper than ``isfinite().all()``. Half
    precisions are summed in float32, whose range a sum of them cannot pass."""
    values = gradient_values(torch, grad)
    if values.element_size() < 4:
        return values.sum(dtype=torch.float32)
    return values.sum()


def all_values_finite(grad: Any) -> bool:
    """One gradient, exactly (to name parameters, only when something is reported)."""
    torch = sys.modules["torch"]
    values = grad._values() if grad.is_sparse else grad
    if values.is_meta or _fake(values):
        return True
    values = torch.view_as_real(values.resolve_conj()) if values.is_complex() else values
    return bool(values.isfinite().all())


def _fake(tensor: Any) -> bool:
    fake = sys.modules.get("torch._subclasses.fake_tensor")
    return fake is not None and isinstance(tensor, fake.FakeTensor)


# Modules of torch.compile's own that hold the user's (Dynamo's FakeRootModule on 2.1)
_COMPILER_MODULES = ("torch._dynamo.", "torch.fx.", "torch._functorch.")


class PendingFlag:
    """A step's device flag (and the zero-gradient probe's count, if any), read once they
    are ready, never by waiting for them."""

    __slots__ = ("event", "host")

    def __init__(self, flag: Any, probe: Probe | None = None) -> None:
        torch = sys.modules["torch"]
        self.event = None
        values = flag.reshape(1)
        if probe is not None:
            probed = probe.flag if probe.flag is not None else torch.tensor(probe.read())
            values = torch.cat((values, probed.reshape(1).to(flag.dtype)))
        self.host = values
        if flag.device.type == "cuda":
            self.host = torch.empty(values.numel(), pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()

    def ready(self) -> bool:
        return self.event is None or bool(self.event.query())

    def nonfinite(self) -> bool:
        return bool(self.host[0].item())

    def probed_zero(self) -> bool:
        """The probed gradient held only zeros (False where nothing was probed)."""
        return self.host.numel() > 1 and not self.host[1].item()


def wrapper_modules() -> tuple[type, ...]:
    """The classes of DDP and FSDP1 modules, where torch.distributed is imported."""
    places = (
        ("torch.nn.parallel.distributed", "DistributedDataParallel"),
        ("torch.distributed.fsdp.fully_sharded_data_parallel", "FullyShardedDataParallel"),
    )
    return tuple(
        kind
        for module, name in places
        if isinstance(kind := getattr(sys.modules.get(module), name, None), type)
    )


def parameter_names(params: list[Any]) -> list[str]:
    """Qualified names (``backbone.0.weight``) from the modules that own the parameters,
    found by one scan of live objects (run only when something is reported)."""
    import gc

    torch = sys.modules["torch"]
    wanted = {id(p) for p in params}
    names: dict[int, str] = {}
    module_type = torch.nn.Module
    fx = sys.modules.get("torch.fx")
    generated: tuple[type, ...] = (fx.GraphModule,) if fx is not None else ()  # compile's
    generated += wrapper_modules()  # DDP and FSDP: the user's own module names its parameters
    for obj in gc.get_objects():
        kind = type(obj)  # never a proxy's __class__
        if (
            issubclass(kind, module_type)
            and not issubclass(kind, generated)
            and not kind.__module__.startswith(_COMPILER_MODULES)
        ):
            for name, param in _named_tensors(obj):
                name = name.replace("_orig_mod.", "")  # a torch.compile'd model's wrapper
                # the outermost module gives the longest, most telling name
                if id(param) in wanted and len(name) > len(names.get(id(param), "")):
                    names[id(param)] = name
    return [names.get(id(p), f"<unnamed {tuple(p.shape)}>") for p in params]


def _named_tensors(module: Any) -> Any:
    """``module``'s parameters by qualified name, then the tensors that require grad kept
    as attributes of it or of its submodules (``func.k``: see ``forward``)."""
    yield from module.named_parameters()
    for prefix, sub in module.named_modules():
        for name, tensor in attribute_tensors(sub):
            yield (f"{prefix}.{name}" if prefix else name), tensor
