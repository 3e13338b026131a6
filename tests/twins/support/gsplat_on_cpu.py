"""Import this before calling gsplat: its CUDA kernel wrappers are replaced by the CPU
stand-ins of tests/gsplat_standins.py (gsplat has no CPU path), and a small scene."""

import gsplat.rendering
import gsplat_standins
import torch

for _name in gsplat_standins.KERNELS:
    setattr(gsplat.rendering, _name, getattr(gsplat_standins, _name))


def scene(n=16):
    generator = torch.Generator().manual_seed(0)
    means = torch.randn(n, 3, generator=generator) * 0.4 + torch.tensor([0, 0, 3.0])
    return dict(
        means=means.requires_grad_(),
        quats=torch.randn(n, 4, generator=generator),
        scales=torch.rand(n, 3, generator=generator) * 0.1 + 0.08,
        opacities=torch.rand(n, generator=generator) * 0.7 + 0.2,
        colors=torch.rand(n, 3, generator=generator).requires_grad_(),
        viewmats=torch.eye(4)[None],
        Ks=torch.tensor([[[24.0, 0, 8], [0, 24.0, 8], [0, 0, 1]]]),
        width=16,
        height=16,
    )


def loss_of(image):
    weights = torch.linspace(0.1, 1.0, image.numel()).reshape(image.shape)
    return (image * weights).sum()
