"""Fits that meet a real singular point of a library's function where the parameters sit,
each beside its reference: the library's fixed release, or the documented manual fix.
Each returns (final loss, the solution) after ``steps`` optimizer steps.

- ``rotation_fit``: RoMa 1.2.1's ``rotvec_to_rotmat`` divides the rotation vector by its
  norm before it takes the small-angle branch, so at the identity (the usual start) the
  forward holds 0/0 and the gradient is NaN; RoMa 1.3.0 is the fixed release. Run in a
  child interpreter (``ROTATION_FIT``), one RoMa per process.
- ``procrustes``: RoMa's ``special_procrustes_naive`` (any release) differentiates through
  torch's SVD: at repeated singular values (a matrix fitted from the identity) its backward
  is NaN, 0 is not its limit, and the next step's SVD of a NaN matrix raises. RoMa's
  ``special_procrustes`` (its own backward) is the fix. Run in a child interpreter
  (``PROCRUSTES_FIT``).
- ``masked_attention``: softmax over a query row that the padding mask masks fully: the
  row is NaN in the forward pass, the loss leaves it out, every gradient is NaN. The
  documented fix fills with a large finite negative instead of ``-inf``.
- ``module_attention``: the same shape through torch's own modules: ``nn.MultiheadAttention``
  (``need_weights`` either way: softmax, then the attention's and ``out_proj``'s matrix
  products over the NaN row), ``nn.TransformerEncoderLayer`` (``norm_first`` either way: a
  LayerNorm over that row) and ``F.scaled_dot_product_attention`` with a boolean mask; a
  padded query whose sliding window holds only padded keys. The manual fix: masks filled
  with -1e9. From torch 2.5 only ``need_weights=True`` makes the NaN (torch's attention
  kernels give a fully masked row 0).
- ``soft_distance``: a soft distance transform of a sparse grid: ``log`` of a kernel sum
  that underflows to exactly 0 far from every occupied cell, then clamped: ``log(0)``'s
  backward is 0/0. The documented fix: ``torch.where`` on a safe input (the double where).
- ``regularised_rotation``: PyTorch3D's ``so3_rotation_angle`` with ``cos_bound=0`` calls
  ``acos`` unbounded: at the identity its backward is -0/0. The fix: the default
  ``cos_bound`` (1e-4).

``masked_attention`` and ``soft_distance`` also run on another ``device`` (the same
initial values, made on the CPU), for ``scripts/gpu_grad_health_repair.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Hook = Callable[[int], None] | None  # called with the step's index before each step
# a fit of RoMa's rotations to a target, run in a child interpreter (one RoMa per process)
ROMA_FIT = """
import json, sys
sys.path.insert(0, {folder!r})
import torch, roma
import autograd_guard
from autograd_guard.testing import capture_events
policy = {policy!r}
if policy is not None:
    autograd_guard.install(policy)
torch.manual_seed(0)
points = torch.randn(32, 3)
target = points @ roma.rotvec_to_rotmat(torch.tensor([0.4, -0.3, 0.6])).T
"""
ROTATION_FIT = (
    ROMA_FIT
    + """
rotvec = torch.nn.Parameter(torch.zeros(3))  # the identity: the usual start
optimizer = torch.optim.Adam([rotvec], lr=0.05)
with capture_events() as events:
    for _ in range({steps}):
        loss = (points @ roma.rotvec_to_rotmat(rotvec).T - target).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
print(json.dumps({{"loss": loss.item(), "solution": rotvec.tolist(), "events": events}}))
"""
)

PROCRUSTES_FIT = (
    ROMA_FIT
    + """
matrix = torch.nn.Parameter(torch.eye(3))  # the identity: singular values 1, 1, 1
optimizer = torch.optim.Adam([matrix], lr=0.05)
error = None
with capture_events() as events:
    try:
        for _ in range({steps}):
            rotation = roma.{function}(matrix)
            loss = (points @ rotation.T - target).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    except Exception as exc:
        error = type(exc).__name__
print(json.dumps({{"loss": loss.item(), "matrix": matrix.tolist(), "error": error,
                  "events": events}}))
"""
)


def masked_attention(
    fixed: bool = False, steps: int = 150, device: str = "cpu", each_step: Hook = None
) -> tuple[float, torch.Tensor]:
    torch.manual_seed(0)
    batch, length, width = 4, 6, 8
    x, target = torch.randn(batch, length, width), torch.randn(batch, length, width)
    pad = torch.ones(batch, length, dtype=torch.bool)
    pad[0, 3:] = pad[2, 4:] = False  # padded positions
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    mask = pad[:, None, :] & causal & pad[:, :, None]  # a padded query masks every key
    layers = [torch.nn.Linear(width, width).to(device) for _ in range(3)]
    x, target, pad, mask = (t.to(device) for t in (x, target, pad, mask))
    optimizer = torch.optim.SGD([p for layer in layers for p in layer.parameters()], lr=0.1)
    q, k, v = layers
    for step in range(steps):
        if each_step is not None:
            each_step(step)
        scores = q(x) @ k(x).transpose(1, 2) / width**0.5
        scores = scores.masked_fill(~mask, -1e9 if fixed else float("-inf"))
        out = torch.softmax(scores, -1) @ v(x)
        loss = (out - target).pow(2)[pad].mean()  # padded rows left out
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item(), torch.cat([p.detach().flatten() for p in q.parameters()]).cpu()


MODULES = ("attention", "attention_no_weights", "encoder", "encoder_norm_first", "sdpa")


def module_attention(
    fixed: bool = False,
    steps: int = 150,
    batch_first: bool = False,
    module: str = "attention",
    skipped: int = 0,
) -> tuple[float, torch.Tensor]:
    """``module``: ``nn.MultiheadAttention`` with ``need_weights`` True (``attention``) or
    False, ``nn.TransformerEncoderLayer`` with ``norm_first`` False (``encoder``) or True,
    or ``F.scaled_dot_product_attention`` with a boolean mask (``sdpa``). ``skipped``: the
    first steps are not taken (a hand-written skip: ``optimizer.step()`` not called)."""
    torch.manual_seed(0)
    length, batch, width = 6, 2, 8
    layer = _attention_layer(module, width, batch_first)
    head = torch.nn.Linear(width, 1)
    params = [*layer.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params, lr=0.01)
    x, target = torch.randn(length, batch, width), torch.randn(length, batch, 1)
    pad = torch.zeros(batch, length, dtype=torch.bool)
    pad[:, 4:] = True  # the last two keys are padding
    window = torch.ones(length, length, dtype=torch.bool)
    for i in range(length):
        window[i, max(0, i - 1) : i + 1] = False  # a sliding window of two: query 5 sees 4, 5
    if fixed:
        pad, window = pad.float() * -1e9, window.float() * -1e9
    valid = (torch.arange(length) < 4).view(length, 1, 1)  # padded queries left out
    if batch_first:
        x, target, valid = (t.transpose(0, 1) for t in (x, target, valid))
    for step in range(steps):
        optimizer.zero_grad()
        y = head(_attend(module, layer, x, pad, window, batch_first))
        loss = torch.where(valid, y - target, torch.zeros_like(y)).pow(2).sum()
        loss.backward()
        if step >= skipped:
            optimizer.step()
    return loss.item(), torch.cat([p.detach().flatten() for p in layer.parameters()])


def _attention_layer(module: str, width: int, batch_first: bool) -> torch.nn.Module:
    if module.startswith("attention"):
        return torch.nn.MultiheadAttention(width, 2, batch_first=batch_first)
    if module.startswith("encoder"):
        return torch.nn.TransformerEncoderLayer(
            width, 2, 16, dropout=0.0, norm_first=module.endswith("first"), batch_first=batch_first
        )
    return torch.nn.Linear(width, 3 * width)  # the query, key and value of sdpa


def _attend(module: str, layer: torch.nn.Module, x, pad, window, batch_first: bool):
    if module.startswith("attention"):
        weights = module == "attention"
        out, _ = layer(x, x, x, key_padding_mask=pad, attn_mask=window, need_weights=weights)
        return out
    if module.startswith("encoder"):
        return layer(x, src_mask=window, src_key_padding_mask=pad)
    rows = x if batch_first else x.transpose(0, 1)  # (batch, length, width)
    batch, length, width = rows.shape
    q, k, v = layer(rows).view(batch, length, 3, 2, width // 2).permute(2, 0, 3, 1, 4)
    if pad.dtype == torch.bool:  # sdpa's boolean mask: True where attention is allowed
        mask = ~(window[None, None] | pad[:, None, None, :])
    else:
        mask = window[None, None] + pad[:, None, None, :]
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = out.permute(0, 2, 1, 3).reshape(batch, length, width)
    return out if batch_first else out.transpose(0, 1)


def soft_distance(
    fixed: bool = False, steps: int = 300, device: str = "cpu", each_step: Hook = None
) -> tuple[float, torch.Tensor]:
    torch.manual_seed(0)
    axis = torch.arange(24, device=device) * 1.0
    grid = torch.stack(torch.meshgrid(axis, axis, indexing="ij"), -1).reshape(-1, 2)
    centres = torch.nn.Parameter(torch.tensor([[3.0, 4.0], [6.0, 5.0]], device=device))
    target = torch.tensor([[12.0, 12.0], [14.0, 9.0]], device=device)
    goal = (torch.cdist(grid, target) ** 2).min(1).values.clamp(max=36.0)
    optimizer = torch.optim.Adam([centres], lr=0.3)
    for step in range(steps):
        if each_step is not None:
            each_step(step)
        kernel = torch.exp(-(torch.cdist(grid, centres) ** 2) / 0.5).sum(1)  # 0 far away
        if fixed:
            safe = torch.where(kernel > 0, kernel, torch.ones_like(kernel))
            log = torch.where(kernel > 0, torch.log(safe), torch.full_like(kernel, -100.0))
        else:
            log = torch.log(kernel).clamp(min=-100.0)
        loss = ((-0.5 * log).clamp(max=36.0) - goal).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item(), centres.detach().flatten().cpu()


def regularised_rotation(fixed: bool = False, steps: int = 150) -> tuple[float, torch.Tensor]:
    from pytorch3d.transforms import so3_exp_map, so3_rotation_angle

    torch.manual_seed(0)
    points = torch.randn(20, 3)
    target = points @ so3_exp_map(torch.tensor([[0.3, -0.2, 0.5]]))[0].T
    log_rotation = torch.nn.Parameter(torch.zeros(1, 3))  # the identity
    optimizer = torch.optim.Adam([log_rotation], lr=0.05)
    bound = 1e-4 if fixed else 0.0
    for _ in range(steps):
        rotation = so3_exp_map(log_rotation)
        angle = so3_rotation_angle(rotation, cos_bound=bound)
        loss = (points @ rotation[0].T - target).pow(2).mean() + 0.01 * angle.pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item(), log_rotation.detach().flatten()
