"""Building blocks shared by every architecture: norms, activations, linear/conv blocks, spatial sizes.

Every architecture in :mod:`modeconn.models` is assembled from these pieces, so a norm or activation
behaves the same in an MLP, a VGG and a ResNet, and the module names are predictable:
``LinearBlock`` has ``.linear``, ``.norm``, ``.act``; ``ConvBlock`` has ``.conv``, ``.norm``, ``.act``.
Every Linear/Conv2d of every architecture is created by :func:`make_linear` / :func:`make_conv`, the one
place that turns the ``asymmetric`` option into W-asymmetric layers (:mod:`.asymmetric`).
A disabled norm is an ``nn.Identity`` (no parameters, no buffers), so the module tree has the same shape
for every norm option.

All modules are ``torch.fx.symbolic_trace``-able: no Python control flow depends on tensor values.
"""

from __future__ import annotations

from typing import Literal, get_args

from torch import nn

from ..errors import ConfigError
from .asymmetric import AsymConv2d, AsymLinear, AsymmetricConfig
from .gating import FiGLU, SigmaAsymmetricConfig

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


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def make_linear(
    in_features: int,
    out_features: int,
    *,
    bias: bool = True,
    asym: AsymmetricConfig | None = None,
    name: str = "",
) -> nn.Linear:
    """``nn.Linear``, or an :class:`~modeconn.models.asymmetric.AsymLinear` when ``asym`` is given.

    Args:
        asym: the layer's asymmetric config (``None``: a stock layer).
        name: the layer's qualified module name in its model (e.g. ``"blocks.0.linear"``); with
            ``asym.mask_seed`` it seeds the layer's fixed offsets and mask, so it must be unique per model.

    Raises:
        ConfigError: ``asym`` does not fit the layer (e.g. ``num_fixed`` ≥ ``in_features``), named with ``name``.
    """
    if asym is None:
        return nn.Linear(in_features, out_features, bias=bias)
    return AsymLinear(in_features, out_features, bias=bias, key=name, **asym.layer_kwargs())


def make_conv(
    in_channels: int,
    out_channels: int,
    kernel_size: int,
    *,
    stride: int = 1,
    padding: int = 0,
    bias: bool = True,
    asym: AsymmetricConfig | None = None,
    name: str = "",
) -> nn.Conv2d:
    """``nn.Conv2d``, or an :class:`~modeconn.models.asymmetric.AsymConv2d` when ``asym`` is given
    (arguments as :func:`make_linear`; the fan-in of a row is ``in_channels · k · k``)."""
    if asym is None:
        return nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=bias)
    return AsymConv2d(
        in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=bias, key=name, **asym.layer_kwargs()
    )


class LinearBlock(nn.Module):
    """``act(norm(linear(x)))``: (N, in_features) → (N, out_features).

    ``asym``/``name``: see :func:`make_linear`; ``name`` is this block's qualified name (the linear is
    ``f"{name}.linear"``). ``gate``: a σ-asymmetric block, whose ``act`` is a :class:`~modeconn.models.gating.FiGLU`
    over the ``out_features`` (key ``f"{name}.act"``) instead of ``activation``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        norm: str = "none",
        activation: str = "relu",
        bias: bool = True,
        asym: AsymmetricConfig | None = None,
        gate: SigmaAsymmetricConfig | None = None,
        name: str = "",
    ) -> None:
        super().__init__()
        self.linear = make_linear(in_features, out_features, bias=bias, asym=asym, name=_key(name, "linear"))
        self.norm = make_norm(norm, out_features, dims=1)
        self.act = make_activation(activation) if gate is None else FiGLU(
            out_features, gate_scale=gate.gate_scale, gate_seed=gate.gate_seed, key=_key(name, "act"))

    def forward(self, x):
        return self.act(self.norm(self.linear(x)))


class ConvBlock(nn.Module):
    """``act(norm(conv(x)))`` with a same-padded k×k conv: (N, C_in, H, W) → (N, C_out, H/stride, W/stride).

    ``asym``/``name``: see :func:`make_conv`; the conv is ``f"{name}.conv"``.
    """

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
        asym: AsymmetricConfig | None = None,
        name: str = "",
    ) -> None:
        super().__init__()
        self.conv = make_conv(
            in_channels, out_channels, kernel_size, stride=stride, padding=kernel_size // 2, bias=bias,
            asym=asym, name=_key(name, "conv"),
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
