"""Small instances of every supported architecture for property tests (shared by several test files)."""

from __future__ import annotations

import torch
from torch import nn

from modeconn.models import build_model

# (id, architecture, kwargs, input shape)
ARCHS = [
    ("mlp", "mlp", {"depth": 3, "width": 16}, (1, 6, 6)),
    ("mlp-nobias", "mlp", {"depth": 2, "width": 12, "bias": False}, (1, 6, 6)),
    ("mlp-ln", "mlp", {"depth": 3, "width": 16, "norm": "layernorm"}, (1, 6, 6)),
    ("mlp-bn", "mlp", {"depth": 3, "width": 16, "norm": "batchnorm"}, (1, 6, 6)),
    ("vgg-bn", "vgg", {"layout": (8, "M", 16, "M"), "batchnorm": True, "classifier_widths": (24, 20)}, (3, 8, 8)),
    ("cnn", "cnn", {"channels": (6, 8), "hidden": (16,)}, (1, 8, 8)),
    ("resnet20-bn", "resnet20", {"width": 0.5, "norm": "batchnorm"}, (1, 8, 8)),
    ("resnet20-ln", "resnet20", {"width": 0.5, "norm": "layernorm"}, (3, 8, 8)),
    ("resnet20-none-x2", "resnet20", {"width": 1.0, "norm": "none"}, (1, 8, 8)),
    # inverted residuals: the first block adds onto the stem's space, stride-2 stage then a residual block
    ("mobilenetv2", "mobilenetv2", {"stem_channels": 8, "stages": ((1, 8, 1, 1), (2, 12, 2, 2)), "last_channels": 16}, (3, 8, 8)),
    # 2×2 = 4 tokens of width 8, two blocks of two heads (head width 4)
    ("cct", "cct", {"dim": 8, "depth": 2, "num_heads": 2, "conv_layers": 2, "conv_channels": 6}, (1, 8, 8)),
]
ARCH_IDS = [a[0] for a in ARCHS]


def make(arch_id: str, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """A model with randomised BatchNorm statistics/affines (so permuting them matters) and an input batch."""
    _, name, kwargs, in_shape = next(a for a in ARCHS if a[0] == arch_id)
    model = build_model(name, in_shape=in_shape, num_classes=5, seed=seed, **kwargs)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)):
                if getattr(m, "weight", None) is not None:
                    m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                    m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))
                if getattr(m, "running_mean", None) is not None:
                    m.running_mean.copy_(0.2 * torch.randn(m.running_mean.shape, generator=g))
                    m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
    model.eval()
    x = torch.randn(8, *in_shape, generator=g)
    return model, x


def digest(sd) -> dict:
    """Bytes-level fingerprint of a state dict (to prove inputs are never mutated)."""
    return {k: (t.dtype, tuple(t.shape), hash(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()))
            for k, t in sd.items()}
