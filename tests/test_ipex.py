"""Guard ipex_xpu. No +xpu wheel installs here, so IPEX is a stand-in distribution (real
dist-info metadata plus an empty module) and the remedies run with the affected device
list set to ["cpu"]. scripts/gpu_ipex.py is not possible: the device machines have
NVIDIA GPUs, not Intel ones."""

from __future__ import annotations

import math
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_attached, guard_state, ipex_standin
from torch import nn

import autograd_guard
from autograd_guard._common import versions as _versions
from autograd_guard.guards import ipex_xpu
from autograd_guard.testing import capture_events

ORIGINAL_DROPOUT = F.dropout
ORIGINAL_INTERPOLATE = F.interpolate


@pytest.fixture
def ipex(tmp_path, monkeypatch):
    """Make a stand-in intel_extension_for_pytorch of the given version importable."""

    def make(version: str) -> None:
        site = ipex_standin(tmp_path / f"site-{version}", version)
        monkeypatch.syspath_prepend(str(site))
        _versions.clear_cache()

    yield make
    sys.modules.pop("intel_extension_for_pytorch", None)
    _versions.clear_cache()


def on_cpu(**options):
    return {"guards": {"ipex_xpu": {"devices": ["cpu"], **options}}}


@pytest.mark.parametrize(
    ("version", "patched"),
    [
        ("2.1.10+xpu", True),
        ("2.1.20+xpu", True),
        ("2.1.30+xpu", False),
        ("2.8.0+cpu", False),
    ],
)
def test_version_gate_reads_the_distribution(ipex, version, patched):
    ipex(version)
    autograd_guard.install(on_cpu())
    assert F.dropout is ORIGINAL_DROPOUT  # nothing before IPEX is imported
    import intel_extension_for_pytorch  # noqa: F401

    assert (F.dropout is not ORIGINAL_DROPOUT) is patched
    assert (F.interpolate is not ORIGINAL_INTERPOLATE) is patched
    state = autograd_guard.status()["guards"]["ipex_xpu"]
    assert state["version"] == version
    gate = "patched" if patched else f"not needed for intel-extension-for-pytorch {version}"
    assert guard_state("ipex_xpu") == gate  # the gate ran: the guard did not just fail to start
    autograd_guard.uninstall()
    assert F.dropout is ORIGINAL_DROPOUT and F.interpolate is ORIGINAL_INTERPOLATE


def test_nothing_is_patched_without_ipex():
    autograd_guard.install(on_cpu())
    assert F.dropout is ORIGINAL_DROPOUT and F.interpolate is ORIGINAL_INTERPOLATE
    assert "intel_extension_for_pytorch" not in sys.modules
    assert guard_state("ipex_xpu") == "waiting for import"


class ViTEmbeddings(nn.Module):
    """transformers' ViTEmbeddings, reduced: patch embedding, CLS token, position
    embeddings resized by interpolate_pos_encoding (the 0.1 offset, bicubic,
    scale_factor) as in the versions TripoSR used, then dropout."""

    def __init__(self, image_size=32, patch_size=8, dim=16, p=0.3):
        super().__init__()
        torch.manual_seed(0)
        self.patch_size = patch_size
        self.projection = nn.Conv2d(3, dim, patch_size, patch_size)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.position_embeddings = nn.Parameter(
            torch.randn(1, (image_size // patch_size) ** 2 + 1, dim)
        )
        self.dropout = nn.Dropout(p)

    def interpolate_pos_encoding(self, embeddings, height, width):
        num_patches = embeddings.shape[1] - 1
        num_positions = self.position_embeddings.shape[1] - 1
        if num_patches == num_positions and height == width:
            return self.position_embeddings
        class_pos_embed = self.position_embeddings[:, 0]
        patch_pos_embed = self.position_embeddings[:, 1:]
        dim = embeddings.shape[-1]
        h0 = height // self.patch_size + 0.1
        w0 = width // self.patch_size + 0.1
        side = int(math.sqrt(num_positions))
        patch_pos_embed = patch_pos_embed.reshape(1, side, side, dim).permute(0, 3, 1, 2)
        patch_pos_embed = nn.functional.interpolate(
            patch_pos_embed,
            scale_factor=(h0 / side, w0 / side),
            mode="bicubic",
            align_corners=False,
        )
        patch_pos_embed = patch_pos_embed.permute(0, 2, 3, 1).reshape(1, -1, dim)
        return torch.cat((class_pos_embed.unsqueeze(0), patch_pos_embed), dim=1)

    def forward(self, pixels):
        embeddings = self.projection(pixels).flatten(2).transpose(1, 2)
        embeddings = torch.cat([self.cls_token.expand(len(pixels), -1, -1), embeddings], 1)
        embeddings = embeddings + self.interpolate_pos_encoding(embeddings, *pixels.shape[-2:])
        return self.dropout(embeddings)


IMAGE = torch.rand(2, 3, 48, 40)  # not the trained 32 x 32: the positions are interpolated


def test_guarded_inference_is_deterministic_and_equals_eval(ipex):
    model = ViTEmbeddings()  # never put in eval mode, like TripoSR's tokenizer
    with torch.no_grad():
        first, second = model(IMAGE), model(IMAGE)
    assert not torch.equal(first, second)  # unguarded: dropout is live
    ipex("2.1.20+xpu")
    autograd_guard.install(on_cpu())
    import intel_extension_for_pytorch  # noqa: F401

    with capture_events() as events, torch.no_grad():
        first, second = model(IMAGE), model(IMAGE)
    model.eval()
    with torch.no_grad():
        expected = model(IMAGE)
    assert torch.equal(first, second) and torch.allclose(first, expected, atol=1e-6)
    actions = {e["action"] for e in events}
    assert actions == {"dropout_identity", "bicubic_on_cpu"}
    assert "model.eval()" in next(e for e in events if e["action"] == "dropout_identity")["event"]


def test_training_with_grad_is_left_alone(ipex):
    ipex("2.1.20+xpu")
    autograd_guard.install(on_cpu())
    import intel_extension_for_pytorch  # noqa: F401

    model = ViTEmbeddings()
    with capture_events() as events:
        first, second = model(IMAGE), model(IMAGE)
    assert not torch.equal(first, second)  # real training: dropout stays
    assert {e["action"] for e in events} == {"bicubic_on_cpu"}


def test_bicubic_matches_the_cpu(ipex):
    ipex("2.1.10+xpu")
    autograd_guard.install(on_cpu(dropout=False))
    import intel_extension_for_pytorch  # noqa: F401

    x = torch.rand(1, 4, 5, 5, requires_grad=True)
    out = F.interpolate(x, scale_factor=(1.42, 1.62), mode="bicubic", align_corners=False)
    expected = ORIGINAL_INTERPOLATE(
        x, scale_factor=(1.42, 1.62), mode="bicubic", align_corners=False
    )
    assert torch.equal(out, expected)
    out.sum().backward()
    assert x.grad is not None  # still differentiable


def wrong_bicubic(
    input,
    size=None,
    scale_factor=None,
    mode="nearest",
    align_corners=None,
    recompute_scale_factor=None,
    antialias=False,
):
    """Stand-in for IPEX before 2.1.30 on XPU: bicubic ignores scale_factor and derives
    the scale from the sizes. The CPU re-run of the cross-check gets the right kernel."""
    if mode == "bicubic" and scale_factor is not None and not ipex_xpu.in_reference_run():
        return ORIGINAL_INTERPOLATE(
            input,
            scale_factor=scale_factor,
            mode=mode,
            align_corners=align_corners,
            recompute_scale_factor=True,
        )
    return ORIGINAL_INTERPOLATE(
        input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias
    )


@pytest.fixture
def xpu_bicubic_bug(monkeypatch):
    monkeypatch.setattr(F, "interpolate", wrong_bicubic)


def crosscheck_policy(**extra):
    return on_cpu(
        bicubic=False,
        crosscheck=[f"{__name__}:ViTEmbeddings"],
        crosscheck_every=2,
        crosscheck_max=2,
        **extra,
    )


def test_crosscheck_catches_a_wrong_bicubic(ipex, xpu_bicubic_bug):
    ipex("2.1.20+xpu")
    autograd_guard.install(crosscheck_policy())
    import intel_extension_for_pytorch  # noqa: F401

    model = ViTEmbeddings().eval()
    with capture_events() as events, torch.no_grad():
        for _ in range(10):
            model(IMAGE)
    checks = [e for e in events if e["action"] == "crosscheck"]
    assert len(checks) == 1  # logged once per call site; counted below
    assert checks[0]["level"] == "warning" and checks[0]["max_abs_diff"] > 1e-3
    assert "diverges" in checks[0]["event"]
    rows = [r for r in autograd_guard.status()["events"] if r["action"] == "crosscheck"]
    assert rows[0]["count"] == 2  # every 2nd forward, at most 2 re-runs


def test_crosscheck_quiet_when_the_device_agrees(ipex):
    ipex("2.1.20+xpu")
    autograd_guard.install(crosscheck_policy())
    import intel_extension_for_pytorch  # noqa: F401

    model = ViTEmbeddings().eval()
    with capture_events() as events, torch.no_grad():
        for _ in range(4):
            model(IMAGE)
    [check] = [e for e in events if e["action"] == "crosscheck"]
    assert check["level"] == "info" and check["max_abs_diff"] < 1e-6


def test_crosscheck_strict_raises(ipex, xpu_bicubic_bug):
    ipex("2.1.20+xpu")
    autograd_guard.install({**crosscheck_policy(), "mode": "strict"})
    import intel_extension_for_pytorch  # noqa: F401

    model = ViTEmbeddings().eval()
    with torch.no_grad():
        model(IMAGE)
        with pytest.raises(autograd_guard.GuardError, match="diverges"):
            model(IMAGE)


def test_strict_raises_at_the_first_risky_call(ipex):
    ipex("2.1.20+xpu")
    autograd_guard.install({**on_cpu(), "mode": "strict"})
    import intel_extension_for_pytorch  # noqa: F401

    with torch.no_grad(), pytest.raises(autograd_guard.GuardError) as info:
        ViTEmbeddings()(IMAGE)
    assert "model.eval()" in str(info.value) and "2.1.30" in str(info.value)


@pytest.mark.parametrize("mode", ["fix", "strict"])
def test_correct_inference_code_is_silent(ipex, mode):
    """alpha_dropout and feature_alpha_dropout default to training=False; eval-mode
    dropout and bilinear interpolation need nothing either."""
    ipex("2.1.10+xpu")
    autograd_guard.install({**on_cpu(), "mode": mode})
    import intel_extension_for_pytorch  # noqa: F401

    functions = ("dropout", "alpha_dropout", "feature_alpha_dropout", "interpolate")
    assert_attached("ipex_xpu", *(f"torch.nn.functional:{f}" for f in functions))
    x = torch.rand(2, 4, 6, 6)
    model = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.AlphaDropout(0.5)).eval()
    with capture_events() as events, torch.no_grad():
        assert torch.equal(F.alpha_dropout(x, 0.5), x)
        assert torch.equal(F.feature_alpha_dropout(x, p=0.5), x)
        assert torch.equal(F.dropout(x, 0.5, False), x)
        F.interpolate(x, scale_factor=2, mode="bilinear")
        assert torch.equal(model(x), x)
    assert events == []


def test_alpha_dropout_asked_to_train_in_inference_is_fixed(ipex):
    ipex("2.1.10+xpu")
    autograd_guard.install(on_cpu())
    import intel_extension_for_pytorch  # noqa: F401

    x = torch.rand(1000)
    with capture_events() as events, torch.no_grad():
        assert torch.equal(F.alpha_dropout(x, 0.5, True), x)
    assert [e["action"] for e in events] == ["dropout_identity"]
