"""MobileNetV2-style network (Sandler et al. 2018, "MobileNetV2: Inverted Residuals and Linear Bottlenecks").

``stem (3×3 conv + norm + ReLU6) → inverted residual blocks → 1×1 conv + norm + ReLU6 → global average
pool → flatten → head``. An inverted residual block is ``1×1 expand conv + norm + ReLU6 → 3×3 depthwise conv
(groups = channels) + norm + ReLU6 → 1×1 project conv + norm`` (a linear bottleneck: no activation after the
projection), plus the input when the stride is 1 and the channel count is kept. With expansion ratio 1 the
expand conv is an ``nn.Identity`` (as in the paper's first stage).

The default configuration is a CPU-sized MobileNetV2 for 28×28 and 32×32 inputs: the stem keeps the
resolution (stride 1, as CIFAR adaptations do) and three stride-2 stages bring 32×32 down to 4×4.

Symmetries (traced by :func:`modeconn.symmetry_spec`): a depthwise conv maps each channel to itself, so its
weight (C, 1, k, k) and bias are bound on axis 0 to the space of its input, which is also the space of its
output; every residual stage shares one space across its blocks (and with the stem when the first block keeps
the stem's width).
"""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import Field
from torch import nn

from ._blocks import NormKind, make_conv, make_linear, make_norm, scale_width
from ._build import MODELS
from ._types import InShape, PosFloat, PosInt
from .asymmetric import AsymConv2d, AsymmetricConfig, AsymmetricOption, layer_asymmetry

StageSpec = tuple[PosInt, PosInt, PosInt, Literal[1, 2]]
"""One stage: (expansion ratio t, output channels c, blocks n, stride s of the first block)."""

DEFAULT_STAGES: tuple[tuple[int, int, int, int], ...] = ((1, 16, 1, 1), (4, 24, 2, 2), (4, 32, 2, 2), (4, 64, 2, 2))
"""The default stages: the paper's first four stages, narrower and with expansion 4 instead of 6."""


def _conv(
    in_channels: int, out_channels: int, kernel_size: int, *, stride: int, groups: int, bias: bool,
    asym: AsymmetricConfig | None, name: str,
) -> nn.Conv2d:
    """A same-padded conv; grouped convs are built here because :func:`make_conv` has no ``groups``."""
    padding = kernel_size // 2
    if groups == 1:
        return make_conv(in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=bias, asym=asym, name=name)
    if asym is None:
        return nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, groups=groups, bias=bias)
    return AsymConv2d(
        in_channels, out_channels, kernel_size, stride=stride, padding=padding, groups=groups, bias=bias, key=name,
        **asym.layer_kwargs(),
    )


class ConvNormAct(nn.Module):
    """``act(norm(conv(x)))`` with a same-padded k×k conv; ``act`` is ReLU6 or, for a projection, ``nn.Identity``.

    ``groups=in_channels=out_channels`` gives a depthwise conv. The conv has a bias only when ``norm="none"``;
    it is named ``f"{name}.conv"`` (the key of its fixed structure when ``asym`` is given).
    """

    def __init__(
        self, in_channels: int, out_channels: int, *, kernel_size: int, stride: int = 1, groups: int = 1,
        norm: str, activation: bool = True, asym: AsymmetricConfig | None = None, name: str = "",
    ) -> None:
        super().__init__()
        self.conv = _conv(
            in_channels, out_channels, kernel_size, stride=stride, groups=groups, bias=norm == "none", asym=asym,
            name=f"{name}.conv" if name else "conv",
        )
        self.norm = make_norm(norm, out_channels, dims=2)
        self.act = nn.ReLU6() if activation else nn.Identity()

    def forward(self, x):
        return self.act(self.norm(self.conv(x)))


class InvertedResidual(nn.Module):
    """``project(depthwise(expand(x)))`` (+ ``x`` when ``stride == 1`` and ``in_channels == out_channels``).

    ``expand``: 1×1 conv to ``in_channels · expand_ratio`` channels (``nn.Identity`` for ratio 1);
    ``depthwise``: 3×3 depthwise conv with ``stride``; ``project``: 1×1 conv to ``out_channels`` without an
    activation. (N, C_in, H, W) → (N, C_out, H/stride, W/stride).
    """

    def __init__(
        self, in_channels: int, out_channels: int, *, stride: int, expand_ratio: int, norm: str,
        asym: AsymmetricConfig | None = None, name: str = "",
    ) -> None:
        super().__init__()
        hidden = in_channels * expand_ratio
        prefix = f"{name}." if name else ""
        self.expand: nn.Module = (
            ConvNormAct(in_channels, hidden, kernel_size=1, norm=norm, asym=asym, name=f"{prefix}expand")
            if expand_ratio != 1 else nn.Identity()
        )
        self.depthwise = ConvNormAct(
            hidden, hidden, kernel_size=3, stride=stride, groups=hidden, norm=norm, asym=asym, name=f"{prefix}depthwise"
        )
        self.project = ConvNormAct(
            hidden, out_channels, kernel_size=1, norm=norm, activation=False, asym=asym, name=f"{prefix}project"
        )
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x):
        out = self.project(self.depthwise(self.expand(x)))
        return x + out if self.residual else out


class MobileNetV2(nn.Module):
    """``stem → blocks (InvertedResiduals) → last (1×1 ConvNormAct) → pool → flatten → head``.

    Input (N, C, H, W), output logits (N, num_classes); any H, W ≥ 1 (global average pooling). Convs are
    He-normal (fan-in) initialised, Linear layers and norms keep PyTorch's defaults. With ``asym``
    every conv (depthwise included) and the head are W-asymmetric (``layers="hidden"``: all but ``stem.conv``
    and ``head``).
    """

    def __init__(
        self, in_channels: int, num_classes: int, *, stem_channels: int, stages: tuple[tuple[int, int, int, int], ...],
        last_channels: int, norm: str, asym: AsymmetricConfig | None = None,
    ) -> None:
        super().__init__()
        self.stem = ConvNormAct(
            in_channels, stem_channels, kernel_size=3, norm=norm, asym=layer_asymmetry(asym, boundary=True), name="stem"
        )
        hidden = layer_asymmetry(asym, boundary=False)
        blocks = []
        channels = stem_channels
        for t, c, n, s in stages:
            for j in range(n):
                blocks.append(InvertedResidual(
                    channels, c, stride=s if j == 0 else 1, expand_ratio=t, norm=norm, asym=hidden, name=f"blocks.{len(blocks)}"
                ))
                channels = c
        self.blocks = nn.Sequential(*blocks)
        self.last = ConvNormAct(channels, last_channels, kernel_size=1, norm=norm, asym=hidden, name="last")
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.head = make_linear(last_channels, num_classes, asym=layer_asymmetry(asym, boundary=True), name="head")
        self._init_convs()

    def _init_convs(self) -> None:
        """He-normal conv weights (fan-in ``in_channels/groups · k²``, so depthwise convs keep the signal's scale)
        and zero conv biases.

        PyTorch's default conv init shrinks the signal by ~√6 per conv + ReLU, and torchvision's fan-out He init
        counts all C·9 outputs of a depthwise conv (ignoring the groups): either way, without a residual around
        every block, an untrained network in eval mode (norm statistics 0/1) maps every input to almost the same
        logits. Masked entries of W-asymmetric convs are reset to +0.0 (their invariant, see :mod:`.asymmetric`).
        """
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                    if isinstance(m, AsymConv2d):
                        m.weight.masked_fill_(m.fixed_mask == 0, 0.0)

    def forward(self, x):
        return self.head(self.flatten(self.pool(self.last(self.blocks(self.stem(x))))))


@MODELS.register("mobilenetv2")
def mobilenetv2(
    in_shape: InShape,
    num_classes: PosInt,
    *,
    width: PosFloat = 1.0,
    stem_channels: PosInt = 16,
    stages: Annotated[tuple[StageSpec, ...], Field(min_length=1)] = DEFAULT_STAGES,
    last_channels: PosInt = 128,
    norm: NormKind = "batchnorm",
    asymmetric: AsymmetricOption = None,
) -> MobileNetV2:
    """MobileNetV2-style CNN.

    Args:
        width: multiplier of every channel count (stem, stages, last conv; ``max(1, round(c * width))``).
        stem_channels: channels of the 3×3 stem conv (stride 1).
        stages: (expansion ratio, channels, blocks, stride ∈ {1, 2}) per stage; only a stage's first block
            has the stride. Default ``DEFAULT_STAGES`` (16, 24, 32, 64 channels; 32×32 → 4×4).
        last_channels: channels of the final 1×1 conv before pooling.
        norm: "batchnorm" (default), "layernorm" (``GroupNorm(1, C)``) or "none" (convs get a bias instead).
        asymmetric: W-asymmetric convs and head (:class:`~modeconn.models.asymmetric.AsymmetricConfig`);
            ``None`` (default) builds standard layers.
    """
    scaled = tuple((t, scale_width(c, width), n, s) for t, c, n, s in stages)
    return MobileNetV2(
        in_shape[0], num_classes, stem_channels=scale_width(stem_channels, width), stages=scaled,
        last_channels=scale_width(last_channels, width), norm=norm, asym=asymmetric,
    )
