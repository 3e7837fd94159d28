"""Architectures by name: ``build_model("mlp" | "vgg" | "resnet20" | "cnn" | "mobilenetv2" | "cct" |
"vit-tiny", in_shape=(C, H, W), num_classes=K)``.

Every image model maps (N, C, H, W) float inputs to (N, K) logits, is ``torch.fx.symbolic_trace``-able (but
"vit-tiny", whose spec comes from the Hugging Face adapter) and carries ``model.modeconn_config`` (architecture name +
full kwargs) so checkpoints can rebuild it.
Every image architecture, the Hugging Face ViT (:data:`HF_IMAGE_MODELS`: "vit-tiny", :mod:`.vit`) included, takes
``asymmetric=None | {...}`` for W-asymmetric layers (:mod:`.asymmetric`); ``mlp`` also takes
``sigma_asymmetric=None | {...}`` for σ-asymmetric FiGLU activations (:mod:`.gating`).
Token models (:data:`TOKEN_MODELS`: "gpt-neox-tiny", :mod:`.causal_lm`, ``in_shape=(T,)``, ``num_classes`` =
vocabulary size) map (N, T) int64 token ids to (N, T, V) next-token logits and wrap a Hugging Face model.
Models are leaves of the package: nothing here imports the rest of modeconn beyond errors/registry.
"""

from __future__ import annotations

from . import causal_lm, cct, convnet, mlp, mobilenet, resnet, vit  # noqa: F401  (register the architectures)
from ._blocks import (
    ACTIVATIONS,
    NORM_KINDS,
    ConvBlock,
    LinearBlock,
    make_activation,
    make_conv,
    make_linear,
    make_norm,
)
from ._build import MODELS, build_model, model_config, validate_model_kwargs
from .asymmetric import (
    AsymConv2d,
    AsymLinear,
    AsymmetricConfig,
    fixed_structure_digest,
    fixed_structure_keys,
    fixed_structure_mismatches,
    fold_fixed_structure,
)
from .causal_lm import TOKEN_MODELS, CausalLM
from .cct import CCT
from .convnet import VGG_LAYOUTS, ConvNet
from .gating import FiGLU, SigmaAsymmetricConfig
from .mlp import MLP
from .mobilenet import MobileNetV2
from .resnet import BasicBlock, ResNet
from .vit import HF_IMAGE_MODELS, ViTClassifier

__all__ = [
    "ACTIVATIONS",
    "CCT",
    "HF_IMAGE_MODELS",
    "MLP",
    "MODELS",
    "NORM_KINDS",
    "TOKEN_MODELS",
    "VGG_LAYOUTS",
    "AsymConv2d",
    "AsymLinear",
    "AsymmetricConfig",
    "BasicBlock",
    "CausalLM",
    "ConvBlock",
    "ConvNet",
    "FiGLU",
    "LinearBlock",
    "MobileNetV2",
    "ResNet",
    "SigmaAsymmetricConfig",
    "ViTClassifier",
    "build_model",
    "fixed_structure_digest",
    "fixed_structure_keys",
    "fixed_structure_mismatches",
    "fold_fixed_structure",
    "make_activation",
    "make_conv",
    "make_linear",
    "make_norm",
    "model_config",
    "validate_model_kwargs",
]
