"""Small vision transformers: a thin wrapper around Hugging Face ``ViTForImageClassification``.

``build_model("vit-tiny", in_shape=(C, H, W), num_classes=K, seed=0, hidden_size=..., ...)`` returns a
:class:`ViTClassifier` whose ``forward(x (N, C, H, W) float32) -> logits (N, K) float32`` is a plain tensor,
so generic code (training, evaluation, interpolation, learned matching) treats it like any other image model.
The Hugging Face model is the attribute ``.model`` (``.model.vit`` holds the patch embedding, CLS token,
position embeddings, blocks and the final LayerNorm, ``.model.classifier`` the linear head on the CLS token),
so the Hugging Face symmetry adapter (:mod:`modeconn.symmetry.hf.vit`) and normalization absorption
(:func:`modeconn.symmetry.absorb_normalization`) find it; its state-dict keys are
``model.vit.embeddings.cls_token``, ``model.vit.layers.{i}.attention.q_proj.weight`` (transformers 5;
``model.vit.encoder.layer.{i}.attention.attention.query.weight`` in 4.x), ..., ``model.classifier.weight``.

It is the *standard* (pre-LN) ViT of Dosovitskiy et al. 2021: patches of ``patch_size × patch_size`` pixels,
a learned CLS token and learned absolute position embeddings. It is built by Hugging Face's initialisation
(truncated-normal(0, ``initializer_range``) weights, zero biases, unit LayerNorm gains) from the CPU generator
that :func:`~modeconn.models.build_model` seeds, so the same seed gives the same bytes. It is not ``torch.fx``-traced:
:func:`modeconn.symmetry_spec` dispatches it to the Hugging Face adapter, which binds ``weight``/``bias`` of every
``nn.Linear`` (and of the patch projection) and leaves every buffer unbound.

``asymmetric`` (docs/methods.md §1 (d), the seed paper's preliminary transformer results): after Hugging Face's
initialisation every ``nn.Linear`` of the model (Q, K, V, O, fc1, fc2, the classifier) and the patch projection
(a Conv2d) are replaced by W-asymmetric layers (:mod:`.asymmetric`, built by the same ``make_linear``/``make_conv``
as every other architecture) that keep the initialised W (masked entries set to 0) and get their fixed F, D
keyed by their qualified names (``model.vit.layers.0.attention.q_proj`` …). ``layers="hidden"`` leaves the patch
projection and the classifier stock. The adapter then binds W as it binds a stock weight and leaves F, D unbound:
no head, stream or MLP permutation leaves the function unchanged any more.
``transformers`` is imported only when a model is built.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
from pydantic import Field
from torch import nn

from ..errors import ConfigError
from ._blocks import make_conv, make_linear
from ._build import MODELS
from ._types import InShape, PosFloat, PosInt
from .asymmetric import AsymmetricConfig, AsymmetricOption, layer_asymmetry

#: Image architectures that wrap a Hugging Face model: symmetry from the HF adapter, not from tracing.
HF_IMAGE_MODELS = frozenset({"vit-tiny"})

Fraction = Annotated[float, Field(ge=0, lt=1)]


class ViTClassifier(nn.Module):
    """An image classifier whose forward maps images to class logits.

    Attributes:
        model: the Hugging Face ``ViTForImageClassification``.
        in_shape: ``(C, H, W)``; num_classes: K.
    """

    def __init__(self, config: Any, in_shape: tuple[int, int, int]) -> None:
        super().__init__()
        from transformers import ViTForImageClassification

        self.model = ViTForImageClassification(config)
        self.in_shape = tuple(int(s) for s in in_shape)
        self.num_classes = int(config.num_labels)

    @classmethod
    def wrap(cls, model: nn.Module, in_shape: tuple[int, int, int]) -> ViTClassifier:
        """Wrap a loaded Hugging Face image classifier (``pixel_values`` → ``logits``, ``config.num_labels``: ViT,
        DeiT …), so that modeconn's evaluation, alignment and paths treat it like its own models. The wrapper holds
        ``model`` itself (no copy)."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.model = model
        self.in_shape = tuple(int(s) for s in in_shape)
        self.num_classes = int(model.config.num_labels)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (N, C, H, W) floating point, ``(C, H, W)`` = ``in_shape`` → logits (N, K) in x's dtype.

        Raises:
            ConfigError: ``x`` is not a 4-D floating-point tensor of the model's ``in_shape``.
        """
        if x.ndim != 4 or not x.dtype.is_floating_point or tuple(x.shape[1:]) != self.in_shape:
            raise ConfigError(
                f"{type(self).__name__} expects images of shape (batch, {', '.join(map(str, self.in_shape))}) with a "
                f"floating dtype, got shape {tuple(x.shape)} {x.dtype}"
            )
        return self.model(pixel_values=x).logits

    def extra_repr(self) -> str:
        return f"in_shape={self.in_shape}, num_classes={self.num_classes}"


def _asymmetric_copy(mod: nn.Module, asym: AsymmetricConfig, key: str) -> nn.Module:
    """A W-asymmetric layer with ``mod``'s shape, its W and bias copied (masked entries of W set to 0)."""
    bias = mod.bias is not None
    if isinstance(mod, nn.Conv2d):
        new = make_conv(mod.in_channels, mod.out_channels, mod.kernel_size[0], stride=mod.stride[0],
                        padding=mod.padding[0], bias=bias, asym=asym, name=key)
    else:
        new = make_linear(mod.in_features, mod.out_features, bias=bias, asym=asym, name=key)
    new.load_state_dict(mod.state_dict(), strict=False)
    new.reset_fixed_entries()
    return new


def make_asymmetric(model: ViTClassifier, asym: AsymmetricConfig) -> None:
    """Replace, in place, every ``nn.Linear`` and the patch projection of ``model`` by its W-asymmetric copy
    (module docstring); with ``layers="hidden"`` the patch projection and the classifier stay stock."""
    proj = "model.vit.embeddings.patch_embeddings.projection"
    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) or n == proj]
    for name, mod in targets:
        layer = layer_asymmetry(asym, boundary=name in (proj, "model.classifier"))
        if layer is None:
            continue
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, _asymmetric_copy(mod, layer, name))


@MODELS.register("vit-tiny")
def vit_tiny(
    in_shape: InShape,
    num_classes: PosInt,
    *,
    patch_size: PosInt = 4,
    hidden_size: PosInt = 64,
    num_hidden_layers: PosInt = 2,
    num_attention_heads: PosInt = 4,
    intermediate_size: PosInt = 256,
    hidden_act: Literal["gelu", "gelu_new", "relu", "silu"] = "gelu",
    qkv_bias: bool = True,
    layer_norm_eps: PosFloat = 1e-6,
    initializer_range: PosFloat = 0.02,
    attention_dropout: Fraction = 0.0,
    hidden_dropout: Fraction = 0.0,
    attn_implementation: Literal["sdpa", "eager"] = "sdpa",
    asymmetric: AsymmetricOption = None,
) -> ViTClassifier:
    """A small standard ViT (``transformers.ViTConfig``; defaults 2 layers × 64 wide, 4 heads of 16, MLP 256,
    4 × 4 patches: a 28 × 28 image is 49 patch tokens + the CLS token; GELU, no dropout).

    Args:
        in_shape: ``(C, H, W)``; H and W must be multiples of ``patch_size``.
        num_classes: K, the classifier's outputs.
        patch_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, hidden_act, qkv_bias,
            layer_norm_eps, initializer_range: as in ``ViTConfig``.
        attention_dropout, hidden_dropout: ``attention_probs_dropout_prob`` and ``hidden_dropout_prob``.
        attn_implementation: "sdpa" or "eager" (explicit softmax); the same function either way.
        asymmetric: W-asymmetric linears and patch projection (:class:`~modeconn.models.asymmetric.AsymmetricConfig`,
            module docstring); ``None`` (default): Hugging Face's stock layers.

    Raises:
        ConfigError: ``hidden_size`` not divisible by ``num_attention_heads``; H or W not a multiple of
            ``patch_size``; an ``asymmetric`` option that does not fit a layer (``num_fixed`` ≥ its fan-in).
    """
    from transformers import ViTConfig

    channels, height, width = in_shape
    if hidden_size % num_attention_heads:
        raise ConfigError(
            f"vit-tiny: hidden_size={hidden_size} must be divisible by num_attention_heads={num_attention_heads}"
        )
    if height % patch_size or width % patch_size:
        raise ConfigError(f"vit-tiny: image {height}×{width} is not a whole number of {patch_size}×{patch_size} patches")
    config = ViTConfig(
        image_size=(height, width) if height != width else height,
        patch_size=patch_size,
        num_channels=channels,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        intermediate_size=intermediate_size,
        hidden_act=hidden_act,
        qkv_bias=qkv_bias,
        layer_norm_eps=layer_norm_eps,
        initializer_range=initializer_range,
        attention_probs_dropout_prob=attention_dropout,
        hidden_dropout_prob=hidden_dropout,
        num_labels=num_classes,
        attn_implementation=attn_implementation,
    )
    model = ViTClassifier(config, in_shape)
    if asymmetric is not None:
        make_asymmetric(model, asymmetric)
    return model
