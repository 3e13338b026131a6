"""Stand-ins for gsplat's CUDA kernel wrappers, so that gsplat's real ``rasterization``
body runs on CPU (gsplat has no CPU path, gsplat#635).

Each stand-in keeps the wrapper's signature and return shapes (gsplat 1.5.3,
``gsplat/cuda/_wrapper.py``) and is built from gsplat's own reference code in
``gsplat.cuda._torch_impl``; the pixel kernel, whose reference needs nerfacc, is a small
differentiable alpha-compositing stand-in. ``scripts/gpu_gsplat.py`` runs the real kernels.
"""

from __future__ import annotations

import math

import torch
from gsplat.cuda import _torch_impl as reference


def fully_fused_projection(
    means,
    covars,
    quats,
    scales,
    viewmats,
    Ks,
    width,
    height,
    eps2d=0.3,
    near_plane=0.01,
    far_plane=1e10,
    radius_clip=0.0,
    packed=False,
    sparse_grad=False,
    calc_compensations=False,
    camera_model="pinhole",
    opacities=None,
):
    """Stand-in: ``_fully_fused_projection``; packed mode keeps the visible (C, N) pairs."""
    if covars is None:
        covars, _ = reference._quat_scale_to_covar_preci(quats, scales, compute_preci=False)
    elif covars.shape[-1] == 6:  # upper triangle
        a, b, c, d, e, f = covars.unbind(-1)
        covars = torch.stack([a, b, c, b, d, e, c, e, f], -1).reshape(*covars.shape[:-1], 3, 3)
    radii, means2d, depths, conics, compensations = reference._fully_fused_projection(
        means,
        covars,
        viewmats,
        Ks,
        width,
        height,
        eps2d,
        near_plane,
        far_plane,
        calc_compensations,
        camera_model,
    )
    if radius_clip > 0:
        radii = radii * (radii.max(dim=-1, keepdim=True).values > radius_clip)
    if not packed:
        return radii, means2d, depths, conics, compensations
    valid = (radii > 0).all(dim=-1).reshape(-1, *radii.shape[-3:-1])  # [B, C, N]
    batch_ids, camera_ids, gaussian_ids = torch.where(valid)
    flat = valid.reshape(-1)

    def pack(t):
        return None if t is None else t.reshape(flat.shape[0], *t.shape[radii.dim() - 1 :])[flat]

    return (
        batch_ids,
        camera_ids,
        gaussian_ids,
        pack(radii),
        pack(means2d),
        pack(depths),
        pack(conics),
        pack(compensations),
    )


def fully_fused_projection_with_ut(
    means,
    quats,
    scales,
    opacities,
    viewmats,
    Ks,
    width,
    height,
    eps2d=0.3,
    near_plane=0.01,
    far_plane=1e10,
    radius_clip=0.0,
    calc_compensations=False,
    camera_model="pinhole",
    **distortion,
):
    """Stand-in: the unscented-transform projection, which is not differentiable (gsplat#726)."""
    with torch.no_grad():
        return fully_fused_projection(
            means,
            None,
            quats,
            scales,
            viewmats,
            Ks,
            width,
            height,
            eps2d,
            near_plane,
            far_plane,
            radius_clip,
            False,
            False,
            calc_compensations,
            camera_model,
        )


def isect_tiles(
    means2d,
    radii,
    depths,
    tile_size,
    tile_width,
    tile_height,
    sort=True,
    segmented=False,
    packed=False,
    n_images=None,
    image_ids=None,
    gaussian_ids=None,
):
    """Stand-in: ``_isect_tiles``; packed input is scattered to [I, N] and mapped back."""
    if not packed:
        return reference._isect_tiles(
            means2d, radii, depths, tile_size, tile_width, tile_height, sort
        )
    n = int(gaussian_ids.max()) + 1 if len(gaussian_ids) else 1
    dense_index = image_ids * n + gaussian_ids
    dense_means = means2d.new_zeros((n_images * n, 2)).index_copy(0, dense_index, means2d)
    dense_radii = radii.new_zeros((n_images * n, 2)).index_copy(0, dense_index, radii)
    dense_depths = depths.new_zeros(n_images * n).index_copy(0, dense_index, depths)
    tiles, isect_ids, flatten_ids = reference._isect_tiles(
        dense_means.reshape(n_images, n, 2),
        dense_radii.reshape(n_images, n, 2),
        dense_depths.reshape(n_images, n),
        tile_size,
        tile_width,
        tile_height,
        sort,
    )
    to_packed = torch.full((n_images * n,), -1, dtype=torch.int64)
    to_packed[dense_index] = torch.arange(len(dense_index))
    return tiles.reshape(-1)[dense_index], isect_ids, to_packed[flatten_ids.long()].int()


def isect_offset_encode(isect_ids, n_images, tile_width, tile_height):
    """Stand-in: ``_isect_offset_encode``."""
    return reference._isect_offset_encode(isect_ids, n_images, tile_width, tile_height)


class _AbsGrad(torch.autograd.Function):
    """Identity that, like the CUDA kernel's backward, sets ``means2d.absgrad``."""

    @staticmethod
    def forward(ctx, means2d):
        ctx.means2d = means2d
        return means2d.view_as(means2d)

    @staticmethod
    def backward(ctx, grad):
        ctx.means2d.absgrad = grad.abs()
        return grad


def rasterize_to_pixels(
    means2d,
    conics,
    colors,
    opacities,
    image_width,
    image_height,
    tile_size,
    isect_offsets,
    flatten_ids,
    backgrounds=None,
    masks=None,
    packed=False,
    absgrad=False,
):
    """Stand-in for the pixel kernel: each tile composites its Gaussians front to back
    (the depth order of ``flatten_ids``), with dense, differentiable torch ops."""
    if absgrad:
        means2d = _AbsGrad.apply(means2d)
    image_dims = isect_offsets.shape[:-2]
    images = math.prod(image_dims)
    channels = colors.shape[-1]
    flat_means = means2d.reshape(-1, 2)
    flat_conics = conics.reshape(-1, 3)
    flat_colors = colors.reshape(-1, channels)
    flat_opacities = opacities.reshape(-1)
    offsets = isect_offsets.reshape(-1).long()
    n_tiles, n_isects = offsets.shape[0], flatten_ids.shape[0]
    bounds = torch.cat([offsets, offsets.new_tensor([n_isects])])
    counts = bounds[1:] - bounds[:-1]
    depth_rank = max(int(counts.max()) if n_tiles else 0, 1)
    tile_of = torch.repeat_interleave(torch.arange(n_tiles), counts)
    rank = torch.arange(n_isects) - offsets[tile_of]
    ids = torch.full((n_tiles, depth_rank), -1, dtype=torch.int64)
    ids[tile_of, rank] = flatten_ids.long()
    present = ids >= 0
    safe = ids.clamp(min=0)
    tile_w = isect_offsets.shape[-1]
    local = torch.arange(tile_size * tile_size)
    tile_xy = torch.stack(
        [
            (torch.arange(n_tiles) % (tile_w * isect_offsets.shape[-2])) % tile_w,
            (torch.arange(n_tiles) % (tile_w * isect_offsets.shape[-2])) // tile_w,
        ],
        -1,
    )
    px = tile_xy[:, None, 0] * tile_size + local[None] % tile_size  # [T, P]
    py = tile_xy[:, None, 1] * tile_size + local[None] // tile_size
    delta = torch.stack([px + 0.5, py + 0.5], -1)[:, None] - flat_means[safe][:, :, None]
    c = flat_conics[safe][:, :, None]
    sigma = 0.5 * (c[..., 0] * delta[..., 0] ** 2 + c[..., 2] * delta[..., 1] ** 2) + (
        c[..., 1] * delta[..., 0] * delta[..., 1]
    )
    alpha = torch.clamp_max(flat_opacities[safe][:, :, None] * torch.exp(-sigma), 0.999)
    alpha = torch.where(present[:, :, None] & (sigma >= 0) & (alpha >= 1 / 255), alpha, 0.0)
    transmittance = torch.cumprod(
        torch.cat([torch.ones_like(alpha[:, :1]), 1 - alpha[:, :-1]], 1), 1
    )
    weights = alpha * transmittance  # [T, G, P]
    tile_colors = torch.einsum("tgp,tgc->tpc", weights, flat_colors[safe])
    tile_alphas = weights.sum(1)[..., None]
    inside = (px < image_width) & (py < image_height)
    image_of = torch.arange(n_tiles)[:, None].expand_as(px) // (tile_w * isect_offsets.shape[-2])
    pixel = (image_of * image_height + py.clamp(max=image_height - 1)) * image_width + px.clamp(
        max=image_width - 1
    )
    out_colors = flat_colors.new_zeros((images * image_height * image_width, channels))
    out_alphas = flat_colors.new_zeros((images * image_height * image_width, 1))
    out_colors = out_colors.index_add(0, pixel[inside], tile_colors[inside])
    out_alphas = out_alphas.index_add(0, pixel[inside], tile_alphas[inside])
    out_colors = out_colors.reshape(*image_dims, image_height, image_width, channels)
    out_alphas = out_alphas.reshape(*image_dims, image_height, image_width, 1)
    if backgrounds is not None:
        out_colors = out_colors + (1 - out_alphas) * backgrounds[..., None, None, :]
    return out_colors, out_alphas


KERNELS = (
    "fully_fused_projection",
    "fully_fused_projection_with_ut",
    "isect_tiles",
    "isect_offset_encode",
    "rasterize_to_pixels",
)
