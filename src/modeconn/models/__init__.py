"""Architectures by name: ``build_model("mlp" | "vgg" | "resnet20" | "cnn", in_shape=(C, H, W), num_classes=K)``.

Every model maps (N, C, H, W) float inputs to (N, K) logits, is ``torch.fx.symbolic_trace``-able and
carries ``model.modeconn_config`` (architecture name + full kwargs) so checkpoints can rebuild it.
Models are leaves of the package: nothing here imports the rest of modeconn beyond errors/registry.
"""

from __future__ import annotations

from . import convnet, mlp, resnet  # noqa: F401  (register the architectures)
from ._blocks import ACTIVATIONS, NORM_KINDS, ConvBlock, LinearBlock, make_activation, make_norm
from ._build import MODELS, build_model, model_config, validate_model_kwargs
from .convnet import VGG_LAYOUTS, ConvNet
from .mlp import MLP
from .resnet import BasicBlock, ResNet

__all__ = [
    "ACTIVATIONS",
    "MODELS",
    "NORM_KINDS",
    "VGG_LAYOUTS",
    "BasicBlock",
    "ConvBlock",
    "ConvNet",
    "LinearBlock",
    "MLP",
    "ResNet",
    "build_model",
    "make_activation",
    "make_norm",
    "model_config",
    "validate_model_kwargs",
]
