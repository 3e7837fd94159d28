"""Small causal language models: a thin wrapper around Hugging Face ``GPTNeoXForCausalLM``.

``build_model("gpt-neox-tiny", in_shape=(T,), num_classes=V, seed=0, hidden_size=..., ...)`` returns a
:class:`CausalLM` whose ``forward(input_ids (B, T) int64) -> logits (B, T, V) float32`` is a plain tensor,
so generic code (training, evaluation, interpolation) treats it like any other model: losses flatten the
``(B, T, V)`` logits to ``(B·T, V)`` next-token predictions (see :func:`modeconn.path.evaluate.evaluate_model`).
The Hugging Face model is the attribute ``.lm`` (``.lm.gpt_neox`` holds embeddings and blocks, ``.lm.lm_head``
the untied output projection), so Hugging Face symmetry adapters find it; its state-dict keys are
``lm.gpt_neox.embed_in.weight``, ``lm.gpt_neox.layers.{i}.attention.query_key_value.weight``, ...,
``lm.lm_head.weight``. The rotary ``inv_freq`` tables are non-persistent buffers (not in the state dict).

Initialisation is Hugging Face's (normal(0, ``initializer_range``) weights, zero biases, unit LayerNorm
gains), drawn from the CPU generator that :func:`~modeconn.models.build_model` seeds, so the same seed
gives the same bytes. Input and output embeddings are never tied (GPT-NeoX's default). ``transformers``
is imported only when a model is built.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
from pydantic import Field
from torch import nn

from ..errors import ConfigError
from ._build import MODELS
from ._types import PosFloat, PosInt

#: Architectures whose inputs are token ids ``(B, T)`` int64 (``in_shape = (T,)``, ``num_classes`` = vocab
#: size) rather than images; generic code uses it to make example inputs (e.g. for tracing).
TOKEN_MODELS = frozenset({"gpt-neox-tiny"})

Fraction = Annotated[float, Field(ge=0, lt=1)]
RotaryPct = Annotated[float, Field(gt=0, le=1)]
ContextShape = tuple[PosInt]
"""Input shape ``(T,)`` of one example: the context length in tokens."""


class CausalLM(nn.Module):
    """A causal LM whose forward maps token ids to next-token logits.

    Attributes:
        lm: the Hugging Face causal LM (``GPTNeoXForCausalLM`` for ``gpt-neox-tiny``; any ``…ForCausalLM`` wrapped
            with :meth:`wrap`).
        vocab_size: V; context_length: T (the training block length; ``max_position_embeddings ≥ T``).
    """

    def __init__(self, config: Any, context_length: int, lm: nn.Module | None = None) -> None:
        super().__init__()
        if lm is None:
            from transformers import GPTNeoXForCausalLM

            lm = GPTNeoXForCausalLM(config)
        self.lm = lm
        self.vocab_size = int(config.vocab_size)
        self.context_length = int(context_length)

    @classmethod
    def wrap(cls, lm: nn.Module, context_length: int) -> CausalLM:
        """Wrap a loaded Hugging Face causal LM (``logits`` output; ``config.vocab_size``), so that modeconn's
        evaluation and paths treat it like its own models. The wrapper holds ``lm`` itself (no copy)."""
        return cls(lm.config, context_length, lm)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``input_ids`` (B, T') int ids in ``[0, V)`` with T' ≤ ``max_position_embeddings`` → logits (B, T', V)
        float32; position t only sees tokens ``≤ t`` (causal).

        Raises:
            ConfigError: ``input_ids`` is not a 2-D integer tensor.
        """
        if input_ids.ndim != 2 or input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
            raise ConfigError(
                f"{type(self).__name__} expects input_ids of shape (batch, tokens) with an integer dtype, "
                f"got shape {tuple(input_ids.shape)} {input_ids.dtype}"
            )
        return self.lm(input_ids=input_ids, use_cache=False).logits

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, context_length={self.context_length}"


@MODELS.register("gpt-neox-tiny")
def gpt_neox_tiny(
    in_shape: ContextShape,
    num_classes: PosInt,
    *,
    hidden_size: PosInt = 256,
    num_hidden_layers: PosInt = 4,
    num_attention_heads: PosInt = 4,
    intermediate_size: PosInt = 1024,
    rotary_pct: RotaryPct = 0.25,
    rotary_emb_base: PosFloat = 10000.0,
    use_parallel_residual: bool = True,
    max_position_embeddings: PosInt | None = None,
    hidden_act: Literal["gelu", "gelu_new", "gelu_fast", "relu", "silu"] = "gelu",
    layer_norm_eps: PosFloat = 1e-5,
    initializer_range: PosFloat = 0.02,
    attention_dropout: Fraction = 0.0,
    hidden_dropout: Fraction = 0.0,
    attn_implementation: Literal["sdpa", "eager"] = "sdpa",
) -> CausalLM:
    """A small GPT-NeoX (``transformers.GPTNeoXConfig``; defaults 4 layers × 256 wide, 4 heads of 64, MLP 1024,
    rotary embeddings on 25 % of each head's dimensions, parallel residual, GELU, no dropout).

    Args:
        in_shape: ``(T,)``, the context length; ``max_position_embeddings`` defaults to T.
        num_classes: the vocabulary size V (the tokenizer's, e.g. ``bundle.num_classes``).
        hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, rotary_pct, rotary_emb_base,
            use_parallel_residual, max_position_embeddings, hidden_act, layer_norm_eps, initializer_range,
            attention_dropout, hidden_dropout: as in ``GPTNeoXConfig``.
        attn_implementation: "sdpa" (``scaled_dot_product_attention``) or "eager" (explicit softmax; slower,
            exposes attention probabilities to hooks). Same function either way.

    Raises:
        ConfigError: ``hidden_size`` not divisible by ``num_attention_heads``; rotary dimensions per head
            (``int(head_dim · rotary_pct)``) zero or odd; ``max_position_embeddings < T``.
    """
    from transformers import GPTNeoXConfig

    (context,) = in_shape
    if hidden_size % num_attention_heads:
        raise ConfigError(
            f"gpt-neox-tiny: hidden_size={hidden_size} must be divisible by num_attention_heads={num_attention_heads}"
        )
    head_dim = hidden_size // num_attention_heads
    rotary_dims = int(head_dim * rotary_pct)
    if rotary_dims < 2 or rotary_dims % 2:
        raise ConfigError(
            f"gpt-neox-tiny: rotary_pct={rotary_pct} gives {rotary_dims} rotary dimensions of head_dim={head_dim}; "
            "it must be a positive even number"
        )
    max_pos = context if max_position_embeddings is None else max_position_embeddings
    if max_pos < context:
        raise ConfigError(
            f"gpt-neox-tiny: max_position_embeddings={max_pos} is smaller than the context length in_shape[0]={context}"
        )
    config = GPTNeoXConfig(
        vocab_size=num_classes,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        intermediate_size=intermediate_size,
        hidden_act=hidden_act,
        rotary_pct=rotary_pct,
        rotary_emb_base=rotary_emb_base,
        attention_dropout=attention_dropout,
        hidden_dropout=hidden_dropout,
        max_position_embeddings=max_pos,
        initializer_range=initializer_range,
        layer_norm_eps=layer_norm_eps,
        use_cache=False,
        use_parallel_residual=use_parallel_residual,
        tie_word_embeddings=False,
        attn_implementation=attn_implementation,
    )
    return CausalLM(config, context)
