"""Building blocks shared by every architecture: norms, activations, linear/conv blocks, spatial sizes.

Every architecture in :mod:`modeconn.models` is assembled from these pieces, so a norm or activation
behaves the same in an MLP, a VGG and a ResNet, and the module names are predictable:
``LinearBlock`` has ``.linear``, ``.norm``, ``.act``; ``ConvBlock`` has ``.conv``, ``.norm``, ``.act``.
A disabled norm is an ``nn.Identity`` (no parameters, no buffers), so the module tree has the same shape
for every norm option.

All modules are ``torch.fx.symbolic_trace``-able: no Python control flow depends on tensor values.
"""

from __future__ import annotations

from typing import Literal, get_args

from torch import nn

from ..errors import ConfigError

NormKind = Literal["none", "layernorm", "batchnorm"]
"""Normalisation choices. For conv feature maps "layernorm" is ``nn.GroupNorm(1, C)`` (normalise over C, H, W)."""

ActivationName = Literal["relu", "gelu", "tanh", "silu", "leaky_relu"]
"""Activation choices; ``leaky_relu`` uses PyTorch's default negative slope 0.01."""

NORM_KINDS: tuple[str, ...] = get_args(NormKind)

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "tanh": nn.Tanh,
    "silu": nn.SiLU,
    "leaky_relu": nn.LeakyReLU,
}
ACTIVATIONS: tuple[str, ...] = get_args(ActivationName)
assert set(ACTIVATIONS) == set(_ACTIVATIONS), "ActivationName and _ACTIVATIONS out of sync"


def make_norm(kind: str, channels: int, dims: int) -> nn.Module:
    """A normalisation layer for ``channels`` features.

    Args:
        kind: "none" (``nn.Identity``), "batchnorm" or "layernorm".
        channels: number of features / channels C.
        dims: 1 for feature vectors (N, C) → ``BatchNorm1d`` / ``LayerNorm(C)``;
            2 for feature maps (N, C, H, W) → ``BatchNorm2d`` / ``GroupNorm(1, C)``.

    Raises:
        ConfigError: unknown ``kind`` (the message lists the valid kinds) or ``dims`` not 1 or 2.
    """
    if dims not in (1, 2):
        raise ConfigError(f"make_norm: dims must be 1 (vectors) or 2 (feature maps), got {dims!r}")
    if kind == "none":
        return nn.Identity()
    if kind == "batchnorm":
        return nn.BatchNorm1d(channels) if dims == 1 else nn.BatchNorm2d(channels)
    if kind == "layernorm":
        return nn.LayerNorm(channels) if dims == 1 else nn.GroupNorm(1, channels)
    raise ConfigError(f"unknown norm {kind!r}; valid norms: {', '.join(NORM_KINDS)}")


def make_activation(name: str) -> nn.Module:
    """A fresh activation module (``nn.ReLU``, ``nn.GELU``, ...) for ``name``.

    Raises:
        ConfigError: unknown ``name``; the message lists the valid names.
    """
    try:
        return _ACTIVATIONS[name]()
    except KeyError:
        raise ConfigError(
            f"unknown activation {name!r}; valid activations: {', '.join(ACTIVATIONS)}"
        ) from None


class LinearBlock(nn.Module):
    """``act(norm(linear(x)))``: (N, in_features) → (N, out_features)."""

    def __init__(
        self, in_features: int, out_features: int, *, norm: str = "none", activation: str = "relu", bias: bool = True
    ) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.norm = make_norm(norm, out_features, dims=1)
        self.act = make_activation(activation)

    def forward(self, x):
        return self.act(self.norm(self.linear(x)))


class ConvBlock(nn.Module):
    """``act(norm(conv(x)))`` with a same-padded k×k conv: (N, C_in, H, W) → (N, C_out, H/stride, W/stride)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        kernel_size: int = 3,
        stride: int = 1,
        norm: str = "none",
        activation: str = "relu",
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_channels, out_channels, kernel_size, stride=stride, padding=kernel_size // 2, bias=bias
        )
        self.norm = make_norm(norm, out_channels, dims=2)
        self.act = make_activation(activation)

    def forward(self, x):
        return self.act(self.norm(self.conv(x)))


def scale_width(channels: int, multiplier: float) -> int:
    """``max(1, round(channels * multiplier))``: a channel count scaled by a width multiplier."""
    return max(1, int(round(channels * multiplier)))


def can_pool(height: int, width: int) -> bool:
    """Whether a 2×2 max-pool keeps both spatial sides ≥ 2 (so a flatten still sees spatial structure)."""
    return height // 2 >= 2 and width // 2 >= 2
