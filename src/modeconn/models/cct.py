"""Compact Convolutional Transformer (Hassani et al. 2021, "Escaping the Big Data Paradigm with Compact
Transformers"): a conv tokenizer, a small pre-norm transformer encoder and sequence pooling.

``tokenizer (conv + ReLU + 3×3/2 max-pool, repeated) → flatten to tokens (N, T, D) → + positional embedding →
encoder blocks → LayerNorm → sequence pooling → head``. An encoder block is pre-norm:
``x + attn(norm1(x))`` then ``x + mlp(norm2(x))`` with a GELU MLP. Sequence pooling weights the tokens by
``softmax over tokens of Linear(D, 1)`` and sums them (no class token).

Attention is :class:`SelfAttention`, written with four separate Linear layers ``q_proj``, ``k_proj``,
``v_proj``, ``o_proj`` and explicit ``unflatten`` / ``transpose`` / ``@`` / ``softmax`` ops rather than
``nn.MultiheadAttention``:

* every projection is an ordinary Linear (or W-asymmetric Linear, so the ``asymmetric`` option works as in
  the other architectures), traced by the generic Linear rule; ``nn.MultiheadAttention`` packs q, k, v into
  one ``in_proj_weight`` and runs ``F.multi_head_attention_forward``, which fx keeps as one opaque call;
* the per-head structure is not hard-coded in the symmetry tracer: it follows from the ops (splitting the
  feature dim into heads, contracting q with k per head, merging heads before ``o_proj``). Hugging Face
  attention layers have the same separate-projection layout (LLaMA/Mistral: ``q_proj``…``o_proj``; BART/CLIP:
  ``out_proj``) and split/merge heads the same way, so these rules carry over to them; what they add (rotary
  embeddings, fused scaled-dot-product attention, k/v heads shared by several q heads) needs rules of its own.

The traced symmetries (see :mod:`modeconn.symmetry.trace`): one space for the residual stream (tokenizer
output, positional embedding, every LayerNorm, the inputs of q/k/v/fc1/pool score/head and the outputs of
o_proj/fc2); per block and head one space shared by q_proj's and k_proj's output rows of that head and one
shared by v_proj's output rows and o_proj's input columns of that head; one space for each MLP hidden layer.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError
from ._blocks import make_conv, make_linear, scale_width
from ._build import MODELS
from ._types import InShape, PosFloat, PosInt
from .asymmetric import AsymmetricConfig, AsymmetricOption, layer_asymmetry


def _pooled_side(side: int) -> int:
    """Output side of ``nn.MaxPool2d(3, stride=2, padding=1)`` (the tokenizer's pool)."""
    return (side - 1) // 2 + 1


class ConvTokenizer(nn.Module):
    """``[conv 3×3 → ReLU → max-pool 3×3/2] × len(channels)`` then flatten: (N, C, H, W) → (N, T, D).

    ``channels``: output channels of each conv, the last one is D. T = H'·W' after the pools
    (each pool maps a side s to ``(s - 1) // 2 + 1``). Unlike the reference code the convs have a bias: no
    norm layer follows them, and REPAIR (:mod:`modeconn.path.repair`) folds its shift correction into the bias.
    """

    def __init__(self, in_channels: int, channels: tuple[int, ...], *, asym: AsymmetricConfig | None = None) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, c in enumerate(channels):
            conv_asym = layer_asymmetry(asym, boundary=i == 0)
            layers += [
                make_conv(in_channels, c, 3, padding=1, asym=conv_asym, name=f"tokenizer.layers.{len(layers)}"),
                nn.ReLU(),
                nn.MaxPool2d(3, stride=2, padding=1),
            ]
            in_channels = c
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(x).flatten(2).transpose(1, 2)


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (all D → D, bias).

    (N, T, D) → (N, T, D): ``o_proj(concat_h softmax(q_h k_hᵀ / sqrt(d_h)) v_h)`` with d_h = D / num_heads.

    Raises:
        ConfigError: D not divisible by ``num_heads``.
    """

    def __init__(self, dim: int, num_heads: int, *, asym: AsymmetricConfig | None = None, name: str = "") -> None:
        super().__init__()
        if dim % num_heads:
            raise ConfigError(f"attention: dim={dim} must be divisible by num_heads={num_heads}")
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim ** -0.5
        prefix = f"{name}." if name else ""
        self.q_proj = make_linear(dim, dim, asym=asym, name=f"{prefix}q_proj")
        self.k_proj = make_linear(dim, dim, asym=asym, name=f"{prefix}k_proj")
        self.v_proj = make_linear(dim, dim, asym=asym, name=f"{prefix}v_proj")
        self.o_proj = make_linear(dim, dim, asym=asym, name=f"{prefix}o_proj")

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(N, T, D) → (N, H, T, d_h)."""
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def forward(self, x):
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        attn = torch.softmax((q * self.scale) @ k.transpose(-2, -1), dim=-1)  # (N, H, T, T)
        return self.o_proj((attn @ v).transpose(1, 2).flatten(2))


class FeedForward(nn.Module):
    """``fc2(gelu(fc1(x)))``: (N, T, D) → (N, T, D) through ``hidden`` features."""

    def __init__(self, dim: int, hidden: int, *, asym: AsymmetricConfig | None = None, name: str = "") -> None:
        super().__init__()
        prefix = f"{name}." if name else ""
        self.fc1 = make_linear(dim, hidden, asym=asym, name=f"{prefix}fc1")
        self.act = nn.GELU()
        self.fc2 = make_linear(hidden, dim, asym=asym, name=f"{prefix}fc2")

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class EncoderBlock(nn.Module):
    """Pre-norm transformer block: ``x = x + attn(norm1(x)); x = x + mlp(norm2(x))`` on (N, T, D)."""

    def __init__(self, dim: int, num_heads: int, hidden: int, *, asym: AsymmetricConfig | None = None, name: str = "") -> None:
        super().__init__()
        prefix = f"{name}." if name else ""
        self.norm1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, num_heads, asym=asym, name=f"{prefix}attn")
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = FeedForward(dim, hidden, asym=asym, name=f"{prefix}mlp")

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SeqPool(nn.Module):
    """Sequence pooling: ``softmax_T(score(x))ᵀ x``: (N, T, D) → (N, D), ``score`` a Linear(D, 1)."""

    def __init__(self, dim: int, *, asym: AsymmetricConfig | None = None, name: str = "") -> None:
        super().__init__()
        self.score = make_linear(dim, 1, asym=asym, name=f"{name}.score" if name else "score")

    def forward(self, x):
        weights = torch.softmax(self.score(x), dim=1).transpose(1, 2)  # (N, 1, T)
        return (weights @ x).flatten(1)


class CCT(nn.Module):
    """``tokenizer → + pos_embedding → blocks → norm → pool → head``: (N, C, H, W) → (N, num_classes).

    ``pos_embedding`` is a learnable (1, T, D) parameter (truncated normal, std 0.2, as the reference code).
    With ``asym`` every conv and Linear is W-asymmetric (``layers="hidden"``: all but the first tokenizer
    conv and ``head``).
    """

    def __init__(
        self, in_shape: tuple[int, int, int], num_classes: int, *, dim: int, depth: int, num_heads: int,
        mlp_hidden: int, tokenizer_channels: tuple[int, ...], asym: AsymmetricConfig | None = None,
    ) -> None:
        super().__init__()
        channels, height, width = in_shape
        self.tokenizer = ConvTokenizer(channels, (*tokenizer_channels, dim), asym=asym)
        for _ in range(len(tokenizer_channels) + 1):
            height, width = _pooled_side(height), _pooled_side(width)
        self.pos_embedding = nn.Parameter(torch.empty(1, height * width, dim))
        nn.init.trunc_normal_(self.pos_embedding, std=0.2)
        hidden = layer_asymmetry(asym, boundary=False)
        self.blocks = nn.Sequential(
            *(EncoderBlock(dim, num_heads, mlp_hidden, asym=hidden, name=f"blocks.{i}") for i in range(depth))
        )
        self.norm = nn.LayerNorm(dim)
        self.pool = SeqPool(dim, asym=hidden, name="pool")
        self.head = make_linear(dim, num_classes, asym=layer_asymmetry(asym, boundary=True), name="head")

    def forward(self, x):
        x = self.tokenizer(x) + self.pos_embedding
        return self.head(self.pool(self.norm(self.blocks(x))))


@MODELS.register("cct")
def cct(
    in_shape: InShape,
    num_classes: PosInt,
    *,
    dim: PosInt = 64,
    depth: PosInt = 2,
    num_heads: PosInt = 4,
    mlp_ratio: PosFloat = 2.0,
    conv_layers: PosInt = 2,
    conv_channels: PosInt = 32,
    asymmetric: AsymmetricOption = None,
) -> CCT:
    """CCT-style transformer (tiny defaults: D=64, 2 blocks, 4 heads; 28×28 → 7×7 = 49 tokens).

    Args:
        dim: token width D (the residual stream); must be divisible by ``num_heads``.
        depth: number of encoder blocks.
        num_heads: attention heads per block (head width ``dim // num_heads``).
        mlp_ratio: MLP hidden width ``max(1, round(dim * mlp_ratio))``.
        conv_layers: tokenizer conv + ReLU + max-pool layers (each halves H and W, rounding up).
        conv_channels: output channels of the tokenizer convs before the last one (which outputs ``dim``).
        asymmetric: W-asymmetric convs and Linear layers (:class:`~modeconn.models.asymmetric.AsymmetricConfig`);
            ``None`` (default) builds standard layers.

    Raises:
        ConfigError: ``dim`` not divisible by ``num_heads`` (the message names both).
    """
    if dim % num_heads:
        raise ConfigError(f"cct: dim={dim} must be divisible by num_heads={num_heads} (got remainder {dim % num_heads})")
    return CCT(
        in_shape, num_classes, dim=dim, depth=depth, num_heads=num_heads, mlp_hidden=scale_width(dim, mlp_ratio),
        tokenizer_channels=(conv_channels,) * (conv_layers - 1), asym=asymmetric,
    )


__all__ = ["CCT", "ConvTokenizer", "EncoderBlock", "FeedForward", "SelfAttention", "SeqPool", "cct"]
