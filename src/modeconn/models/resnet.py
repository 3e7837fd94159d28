"""CIFAR-style ResNet20 (He et al. 2016, "Deep Residual Learning", section 4.2: 3 stages × 3 BasicBlocks)."""

from __future__ import annotations

from torch import nn

from ._blocks import ConvBlock, NormKind, make_activation, make_conv, make_linear, make_norm, scale_width
from ._build import MODELS
from ._types import InShape, PosFloat, PosInt
from .asymmetric import AsymmetricConfig, AsymmetricOption, layer_asymmetry


class BasicBlock(nn.Module):
    """``relu(norm2(conv2(relu(norm1(conv1(x))))) + shortcut(x))``: (N, C_in, H, W) → (N, C_out, H/s, W/s).

    ``shortcut`` is ``nn.Identity`` when shapes agree, else a 1×1 conv with stride s followed by a norm
    (``nn.Sequential(conv, norm)``). Convs have a bias only when ``norm="none"``.
    ``asym``/``name``: every conv (shortcut included) is W-asymmetric with ``asym``; ``name`` is this block's
    qualified name in the model (it keys the fixed structure, see :func:`~modeconn.models._blocks.make_conv`).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        stride: int,
        norm: str,
        asym: AsymmetricConfig | None = None,
        name: str = "",
    ) -> None:
        super().__init__()
        bias = norm == "none"
        prefix = f"{name}." if name else ""
        self.block1 = ConvBlock(
            in_channels, out_channels, stride=stride, norm=norm, bias=bias, asym=asym, name=f"{prefix}block1"
        )
        self.conv2 = make_conv(out_channels, out_channels, 3, padding=1, bias=bias, asym=asym, name=f"{prefix}conv2")
        self.norm2 = make_norm(norm, out_channels, dims=2)
        if stride != 1 or in_channels != out_channels:
            self.shortcut: nn.Module = nn.Sequential(
                make_conv(in_channels, out_channels, 1, stride=stride, bias=bias, asym=asym, name=f"{prefix}shortcut.0"),
                make_norm(norm, out_channels, dims=2),
            )
        else:
            self.shortcut = nn.Identity()
        self.act = make_activation("relu")

    def forward(self, x):
        return self.act(self.norm2(self.conv2(self.block1(x))) + self.shortcut(x))


class ResNet(nn.Module):
    """``stem ConvBlock → stages of BasicBlocks → global average pool → flatten → head``.

    Input (N, C, H, W), output logits (N, num_classes). Stage ``i`` has ``widths[i]`` channels; every stage
    after the first halves H and W in its first block. With ``asym`` every conv and the head are
    W-asymmetric (``layers="hidden"``: all but ``stem.conv`` and ``head``).
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        *,
        widths: tuple[int, ...],
        blocks_per_stage: int,
        norm: str,
        asym: AsymmetricConfig | None = None,
    ) -> None:
        super().__init__()
        self.stem = ConvBlock(
            in_channels, widths[0], norm=norm, bias=norm == "none", asym=layer_asymmetry(asym, boundary=True), name="stem"
        )
        hidden = layer_asymmetry(asym, boundary=False)
        stages = []
        channels = widths[0]
        for i, w in enumerate(widths):
            blocks = []
            for j in range(blocks_per_stage):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(BasicBlock(channels, w, stride=stride, norm=norm, asym=hidden, name=f"stages.{i}.{j}"))
                channels = w
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.head = make_linear(channels, num_classes, asym=layer_asymmetry(asym, boundary=True), name="head")

    def forward(self, x):
        return self.head(self.flatten(self.pool(self.stages(self.stem(x)))))


@MODELS.register("resnet20")
def resnet20(
    in_shape: InShape,
    num_classes: PosInt,
    *,
    width: PosFloat = 1.0,
    norm: NormKind = "batchnorm",
    asymmetric: AsymmetricOption = None,
) -> ResNet:
    """ResNet20: 16/32/64 channels × ``width`` (``max(1, round(c * width))``), 3 BasicBlocks per stage.

    ``norm="layernorm"`` uses ``GroupNorm(1, C)`` on feature maps; ``"none"`` gives convs a bias instead.
    Works for any H, W ≥ 1 (global average pooling), e.g. 1×28×28 and 3×32×32.
    ``asymmetric``: W-asymmetric convs and head (:class:`~modeconn.models.asymmetric.AsymmetricConfig`, as
    the reference's W-ResNet); ``None`` (default) builds standard layers.
    """
    widths = tuple(scale_width(c, width) for c in (16, 32, 64))
    return ResNet(in_shape[0], num_classes, widths=widths, blocks_per_stage=3, norm=norm, asym=asymmetric)
