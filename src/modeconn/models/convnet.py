"""Plain convolutional networks (VGG-style and a small CNN) from one declarative layout.

A layout is a sequence of conv widths (3×3 same-padded ``ConvBlock``) and ``"M"`` (2×2 max-pool).
Max-pools that would shrink the smaller spatial side below 2 are skipped, so one layout works for
8×8 digits, 28×28 MNIST and 32×32 CIFAR, and the flatten always sees C·H·W features with H, W ≥ 2
(unless the input itself is smaller). The skipping depends only on ``in_shape``, so a model rebuilt
from its config has exactly the same layers.
"""

from __future__ import annotations

from typing import Literal

from torch import nn

from ..errors import ConfigError
from ._blocks import ActivationName, ConvBlock, LinearBlock, can_pool, make_linear, scale_width
from ._build import MODELS
from ._types import InShape, PosFloat, PosInt
from .asymmetric import AsymmetricConfig, AsymmetricOption, layer_asymmetry

LayoutItem = PosInt | Literal["M"]

VGG_LAYOUTS: dict[str, tuple[int | str, ...]] = {
    "small": (32, "M", 64, "M", 128, 128, "M"),
    "vgg11": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg13": (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    "vgg19": (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"),
}
"""Named VGG layouts (Simonyan & Zisserman 2015, configs A/B/D/E) plus a small default for tiny inputs."""


class ConvNet(nn.Module):
    """``features (ConvBlocks + max-pools) → flatten → classifier (LinearBlocks) → head``.

    Input (N, C, H, W), output logits (N, num_classes). Modules: ``features.{i}.conv/.norm/.act`` and
    ``features.{i}`` = ``nn.MaxPool2d``, ``flatten``, ``classifier.{j}.linear/.act``, ``head``. With ``asym``
    the convs/linears are W-asymmetric (``layers="hidden"``: all but the first conv and the head).
    """

    def __init__(
        self,
        in_shape: tuple[int, int, int],
        num_classes: int,
        *,
        layout: tuple[int | str, ...],
        classifier_widths: tuple[int, ...],
        batchnorm: bool,
        activation: str,
        asym: AsymmetricConfig | None = None,
    ) -> None:
        super().__init__()
        channels, height, width = in_shape
        norm = "batchnorm" if batchnorm else "none"
        features: list[nn.Module] = []
        first = True
        for item in layout:
            if item == "M":
                if can_pool(height, width):
                    features.append(nn.MaxPool2d(2))
                    height, width = height // 2, width // 2
            else:
                # a conv followed by batchnorm needs no bias (the norm's shift replaces it)
                features.append(
                    ConvBlock(
                        channels, int(item), norm=norm, activation=activation, bias=not batchnorm,
                        asym=layer_asymmetry(asym, boundary=first), name=f"features.{len(features)}",
                    )
                )
                channels, first = int(item), False
        self.features = nn.Sequential(*features)
        self.flatten = nn.Flatten()
        widths = [channels * height * width, *classifier_widths]
        self.classifier = nn.Sequential(
            *(
                LinearBlock(a, b, activation=activation, asym=layer_asymmetry(asym, boundary=False), name=f"classifier.{j}")
                for j, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=False))
            )
        )
        self.head = make_linear(widths[-1], num_classes, asym=layer_asymmetry(asym, boundary=True), name="head")

    def forward(self, x):
        return self.head(self.classifier(self.flatten(self.features(x))))


def _resolve_layout(layout: str | tuple[int | str, ...], multiplier: float) -> tuple[int | str, ...]:
    if isinstance(layout, str):
        if layout not in VGG_LAYOUTS:
            raise ConfigError(f"unknown vgg layout {layout!r}; valid layouts: {', '.join(VGG_LAYOUTS)} or a list")
        layout = VGG_LAYOUTS[layout]
    if not any(item != "M" for item in layout):
        raise ConfigError(f"vgg layout {list(layout)!r} has no conv layer")
    return tuple(item if item == "M" else scale_width(int(item), multiplier) for item in layout)


@MODELS.register("vgg")
def vgg(
    in_shape: InShape,
    num_classes: PosInt,
    *,
    layout: str | tuple[LayoutItem, ...] = "small",
    width: PosFloat = 1.0,
    batchnorm: bool = False,
    classifier_widths: tuple[PosInt, ...] = (256, 256),
    activation: ActivationName = "relu",
    asymmetric: AsymmetricOption = None,
) -> ConvNet:
    """VGG-style CNN.

    Args:
        layout: a name in ``VGG_LAYOUTS`` ("small" default, "vgg11", "vgg13", "vgg16", "vgg19") or a list of
            conv widths and "M" max-pools.
        width: multiplier applied to every conv width (``max(1, round(c * width))``).
        batchnorm: conv → BatchNorm2d → activation (convs then have no bias).
        classifier_widths: hidden Linear widths between the flatten and the head (may be empty).
        asymmetric: W-asymmetric convs and linears (:class:`~modeconn.models.asymmetric.AsymmetricConfig`);
            ``None`` (default) builds standard layers.

    Raises:
        ConfigError: unknown layout name or a layout without conv layers.
    """
    return ConvNet(
        in_shape,
        num_classes,
        layout=_resolve_layout(layout, width),
        classifier_widths=tuple(classifier_widths),
        batchnorm=batchnorm,
        activation=activation,
        asym=asymmetric,
    )


@MODELS.register("cnn")
def cnn(
    in_shape: InShape,
    num_classes: PosInt,
    *,
    channels: tuple[PosInt, ...] = (32, 64),
    hidden: tuple[PosInt, ...] = (128,),
    activation: ActivationName = "relu",
    asymmetric: AsymmetricOption = None,
) -> ConvNet:
    """Small CNN: each of ``channels`` is a 3×3 conv + activation + 2×2 max-pool, then Linear layers
    of ``hidden`` widths and the head (``hidden=()`` gives one Linear layer). ``asymmetric``: as for ``vgg``."""
    if not channels:
        raise ConfigError("cnn: channels must list at least one conv width")
    layout: list[int | str] = []
    for c in channels:
        layout += [c, "M"]
    return ConvNet(
        in_shape,
        num_classes,
        layout=tuple(layout),
        classifier_widths=tuple(hidden),
        batchnorm=False,
        activation=activation,
        asym=asymmetric,
    )
