"""Multi-layer perceptron on flattened inputs."""

from __future__ import annotations

import math

from torch import nn

from ._blocks import ActivationName, LinearBlock, NormKind, make_linear
from ._build import MODELS
from ._types import InShape, NonNegInt, PosInt
from ..errors import ConfigError
from .asymmetric import AsymmetricConfig, AsymmetricOption, layer_asymmetry
from .gating import SigmaAsymmetricConfig, SigmaAsymmetricOption


class MLP(nn.Module):
    """``flatten → depth × LinearBlock(width) → Linear(num_classes)``.

    Input (N, C, H, W) (any shape whose trailing dims multiply to C·H·W), output logits (N, num_classes).
    Modules: ``flatten``, ``blocks.{i}.linear/.norm/.act``, ``head``. With ``asym`` the linears are
    :class:`~modeconn.models.asymmetric.AsymLinear` (``layers="hidden"``: not ``blocks.0.linear`` nor ``head``).
    With ``gate`` every ``blocks.{i}.act`` is a :class:`~modeconn.models.gating.FiGLU` (σ-asymmetric).
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
        asym: AsymmetricConfig | None = None,
        gate: SigmaAsymmetricConfig | None = None,
    ) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        widths = [in_features] + [width] * depth
        self.blocks = nn.Sequential(
            *(
                LinearBlock(
                    a, b, norm=norm, activation=activation, bias=bias,
                    asym=layer_asymmetry(asym, boundary=i == 0), gate=gate, name=f"blocks.{i}",
                )
                for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=False))
            )
        )
        self.head = make_linear(widths[-1], num_classes, bias=bias, asym=layer_asymmetry(asym, boundary=True), name="head")

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
    asymmetric: AsymmetricOption = None,
    sigma_asymmetric: SigmaAsymmetricOption = None,
) -> MLP:
    """MLP with ``depth`` hidden layers of ``width`` units; ``norm`` sits between linear and activation.

    ``depth=0`` is multinomial logistic regression. ``bias`` applies to every Linear including the head.
    ``asymmetric``: W-asymmetric linears (:class:`~modeconn.models.asymmetric.AsymmetricConfig`), e.g.
    ``{"sigma_f": 1.0, "mask_seed": 0}``; ``None`` (default) builds standard layers.
    ``sigma_asymmetric``: σ-asymmetric hidden layers (:class:`~modeconn.models.gating.SigmaAsymmetricConfig`, e.g.
    ``{"gate_seed": 0}``): FiGLU ``x ⊙ sigmoid(Cx)`` with a fixed random C per layer replaces ``activation``.

    Raises:
        ConfigError: ``sigma_asymmetric`` with an ``activation`` other than the default (FiGLU replaces it).
    """
    if sigma_asymmetric is not None and activation != "relu":
        raise ConfigError(f"mlp: sigma_asymmetric replaces the activation by FiGLU; drop activation={activation!r}")
    return MLP(
        math.prod(in_shape), num_classes, depth=depth, width=width, norm=norm, activation=activation, bias=bias,
        asym=asymmetric, gate=sigma_asymmetric,
    )
