"""Autograd Functions for grad_audit's tests and its false-alarm measurement
(``scripts/grad_audit_false_alarms.py``): a clean corpus of correct Functions written as
libraries write them, and bug cases whose backward is wrong. Each case runs one forward and
backward from a seed and returns the gradients it produced (``CLEAN[name](seed)``)."""

from __future__ import annotations

import torch
from torch.autograd import Function
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint


class Tanh(Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return torch.tanh(x * w)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        d = 1 - torch.tanh(x * w) ** 2
        return g * d * w, (g * d * x).sum(0)


class Relu(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x > 0)


class Abs(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.abs()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.sign()


class Clamp(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(-0.5, 0.5)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * ((x > -0.5) & (x < 0.5))


class Max(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.maximum(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g * (a >= b), g * (a < b)


class Float32Only(Function):
    """A kernel that takes float32 only (as Warp's do): float64 raises."""

    @staticmethod
    def forward(ctx, x, w):
        if x.dtype != torch.float32 or w.dtype != torch.float32:
            raise TypeError("float32 arrays only")
        ctx.save_for_backward(x, w)
        return x * x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return 2 * g * x * w, (g * x * x).sum(0)


class Dropout(Function):
    """A random forward, from torch's own generator."""

    @staticmethod
    def forward(ctx, x):
        mask = (torch.rand_like(x) > 0.5).to(x.dtype) * 2
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return g * mask


class Injector(Function):
    """An optimal-transport library's gradient injector: the forward returns a value
    computed without grad, the backward hands out gradients computed with it."""

    @staticmethod
    def forward(ctx, value, a, b, grad_a, grad_b):
        ctx.save_for_backward(grad_a, grad_b)
        return value.clone()

    @staticmethod
    def backward(ctx, g):
        grad_a, grad_b = ctx.saved_tensors
        return None, g * grad_a, g * grad_b, None, None


class Adjoint(Function):
    """An ODE adjoint method: the parameters are passed for their gradients, the forward
    reads them through the closure (``func``), never the copies passed in."""

    @staticmethod
    def forward(ctx, func, y0, *params):
        y = y0
        with torch.no_grad():
            for _ in range(4):
                y = y + 0.1 * func(y)
        ctx.func = func
        ctx.save_for_backward(y0)
        return y

    @staticmethod
    def backward(ctx, g):
        (y0,) = ctx.saved_tensors
        with torch.enable_grad():
            y = y0.detach().requires_grad_()
            out = y
            for _ in range(4):
                out = out + 0.1 * ctx.func(out)
            params = list(ctx.func.parameters())
            grads = torch.autograd.grad(out, [y, *params], g)
        return (None, *grads)


class ArgMax(Function):
    """A non-differentiable second output."""

    @staticmethod
    def forward(ctx, x):
        index = x.argmax(-1)
        ctx.mark_non_differentiable(index)
        ctx.save_for_backward(x)
        return x * 3, index

    @staticmethod
    def backward(ctx, g, _):
        return g * 3


class Scale(Function):
    """In place, ``mark_dirty``."""

    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


class Square(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g * x


# -- bug cases ------------------------------------------------------------------------


class WrongSign(Tanh):
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        d = 1 - torch.tanh(x * w) ** 2
        return g * d * w, -(g * d * x).sum(0)


class ZeroesIncoming(Tanh):
    """Writes into its incoming gradient, as Warp's interop adjoint launch does (through a
    raw pointer: the version counter does not move; here through ``.data``)."""

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        d = 1 - torch.tanh(x * w) ** 2
        result = g * d * w, (g * d * x).sum(0)
        g.data.zero_()
        return result


class SharedBuffer(Function):
    """Its backward reads a buffer its forward shares between calls (a kernel library's
    workspace): right for one call, wrong when a second call overwrites the buffer before
    the first one's backward. Only the real backward shows it: a private re-run of one
    call (gradcheck's) is right."""

    buffer: torch.Tensor | None = None

    @staticmethod
    def forward(ctx, x, w):
        SharedBuffer.buffer = x.detach().clone()
        ctx.save_for_backward(w)
        return x * x * w

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        x = SharedBuffer.buffer
        return 2 * g * x * w, (g * x * x).sum(0)


def _inputs(
    seed: int, dtype: torch.dtype = torch.float32, cols: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x (rows, cols) and w (cols): shapes and a scale (1e-2 to 1e2) drawn from the seed."""
    gen = torch.Generator().manual_seed(seed)
    rows = int(torch.randint(1, 33, (), generator=gen))
    cols = cols or int(torch.randint(1, 9, (), generator=gen))
    scale = 10 ** float(torch.empty(()).uniform_(-2, 2, generator=gen))
    x = (torch.randn(rows, cols, generator=gen, dtype=dtype) * scale).requires_grad_()
    w = torch.randn(cols, generator=gen, dtype=dtype).requires_grad_()
    return x, w


def _grads(loss: torch.Tensor, *leaves: torch.Tensor) -> list[torch.Tensor]:
    loss.backward()
    return [t.grad for t in leaves]


def tanh(seed, fn=Tanh, dtype=torch.float32):
    x, w = _inputs(seed, dtype)
    return _grads((fn.apply(x, w) * torch.arange(1, x.shape[1] + 1, dtype=dtype)).sum(), x, w)


def elementwise(fn):
    def case(seed):
        x, w = _inputs(seed)
        return _grads((fn.apply(x * w) ** 2).sum(), x, w)

    return case


def maximum(seed):
    x, w = _inputs(seed)
    return _grads((Max.apply(x, w.expand_as(x)) ** 2).sum(), x, w)


def float32_only(seed):
    x, w = _inputs(seed)
    return _grads(Float32Only.apply(x, w).sin().sum(), x, w)


def dropout(seed):
    x, w = _inputs(seed)
    return _grads((Dropout.apply(x * w) ** 2).sum(), x, w)


def injector(seed):
    x, w = _inputs(seed)
    with torch.no_grad():  # the value and its gradient, computed by a solver
        value, grad_x, grad_w = (x * w).pow(2).sum(), 2 * x * w * w, (2 * x * x * w).sum(0)
    return _grads(Injector.apply(value, x, w, grad_x, grad_w) * 1.5, x, w)


def adjoint(seed):
    gen = torch.Generator().manual_seed(seed)
    func = torch.nn.Linear(4, 4)
    with torch.no_grad():
        for p in func.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    y0 = torch.randn(3, 4, generator=gen).requires_grad_()
    y = Adjoint.apply(func, y0, *func.parameters())
    return _grads((y**2).sum(), y0, *func.parameters())


def argmax(seed):
    x, w = _inputs(seed)
    value, index = ArgMax.apply(x * w)
    return _grads((value**2).sum() + index.sum() * 0, x, w)


def dirty(seed):
    x, w = _inputs(seed)
    return _grads((Scale.apply(x * w) ** 2).sum(), x, w)


def once(seed):
    x, w = _inputs(seed)
    return _grads(Square.apply(x * w).sum(), x, w)


def checkpointed(reentrant: bool, returns: str):
    def case(seed):
        torch.manual_seed(seed)
        lin = torch.nn.Linear(4, 4)
        x, _ = _inputs(seed, cols=4)

        def segment(v):
            out = torch.tanh(lin(v))
            aux = out.pow(2).mean()  # an auxiliary loss (an MoE router's balance loss)
            shapes = {"tensor": out, "tuple": (out, out * 2), "list": [out]}
            return {**shapes, "aux_tuple": (out, aux), "aux_list": (out, [aux])}[returns]

        out = checkpoint(segment, x, use_reentrant=reentrant)
        first = out if returns == "tensor" else out[0]
        aux = out[1] if returns == "aux_tuple" else out[1][0] if returns == "aux_list" else 0
        return _grads(((first + x) ** 2).sum() + aux, x, lin.weight)

    return case


def two_layers_sharing_a_buffer(seed):
    x, w = _inputs(seed)
    hidden = SharedBuffer.apply(x, w).tanh()
    return _grads(SharedBuffer.apply(hidden, w * 0.5).pow(2).sum(), x, w)


def residual_zeroed(seed):
    x, w = _inputs(seed)
    return _grads((x + ZeroesIncoming.apply(x, w)).pow(2).sum(), x, w)


CLEAN = {
    "tanh": tanh,
    "tanh_float64": lambda seed: tanh(seed, dtype=torch.float64),
    "relu": elementwise(Relu),
    "abs": elementwise(Abs),
    "clamp": elementwise(Clamp),
    "max": maximum,
    "float32_only": float32_only,
    "dropout": dropout,
    "injector": injector,
    "adjoint": adjoint,
    "argmax": argmax,
    "mark_dirty": dirty,
    "once_differentiable": once,
    "checkpoint_reentrant": checkpointed(True, "tensor"),
    "checkpoint_reentrant_tuple": checkpointed(True, "tuple"),
    "checkpoint_list": checkpointed(False, "list"),
    "checkpoint_reentrant_aux_tuple": checkpointed(True, "aux_tuple"),
    "checkpoint_aux_list": checkpointed(False, "aux_list"),
    "shared_buffer_one_call": lambda seed: tanh(seed, SharedBuffer),
}
# name: (case, the action it is named by)
BUGS = {
    "wrong_sign": (lambda seed: tanh(seed, WrongSign), "wrong_gradient"),
    "zeroes_grad_output": (residual_zeroed, "grad_output_modified"),
    "checkpoint_reentrant_list": (checkpointed(True, "list"), "cut_gradient"),
    # the segment's tensor is tracked, the aux loss beside it in a list is not
    "checkpoint_reentrant_aux_list": (checkpointed(True, "aux_list"), "cut_gradient"),
    "shared_buffer": (two_layers_sharing_a_buffer, "wrong_gradient"),
}
