"""Multi-layer perceptron on flattened inputs."""

from __future__ import annotations

import math

from torch import nn

from ._blocks import ActivationName, LinearBlock, NormKind
from ._build import MODELS
from ._types import InShape, NonNegInt, PosInt


class MLP(nn.Module):
    """``flatten → depth × LinearBlock(width) → Linear(num_classes)``.

    Input (N, C, H, W) (any shape whose trailing dims multiply to C·H·W), output logits (N, num_classes).
    Modules: ``flatten``, ``blocks.{i}.linear/.norm/.act``, ``head``.
    """

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        *,
        depth: int,
        width: int,
        norm: str,
        activation: str,
        bias: bool,
    ) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        widths = [in_features] + [width] * depth
        self.blocks = nn.Sequential(
            *(
                LinearBlock(a, b, norm=norm, activation=activation, bias=bias)
                for a, b in zip(widths[:-1], widths[1:])
            )
        )
        self.head = nn.Linear(widths[-1], num_classes, bias=bias)

    def forward(self, x):
        return self.head(self.blocks(self.flatten(x)))


@MODELS.register("mlp")
def mlp(
    in_shape: InShape,
    num_classes: PosInt,
    *,
    depth: NonNegInt = 3,
    width: PosInt = 512,
    norm: NormKind = "none",
    activation: ActivationName = "relu",
    bias: bool = True,
) -> MLP:
    """MLP with ``depth`` hidden layers of ``width`` units; ``norm`` sits between linear and activation.

    ``depth=0`` is multinomial logistic regression. ``bias`` applies to every Linear including the head.
    """
    return MLP(
        math.prod(in_shape), num_classes, depth=depth, width=width, norm=norm, activation=activation, bias=bias
    )
