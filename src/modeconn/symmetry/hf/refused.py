"""Model types refused with the reason, before the automatic fallback (:mod:`.infer`) tries any layout.

Each entry states why no registered layout can describe the model type's symmetries yet — the spaces it would need
that no :class:`~modeconn.symmetry.hf.structure.Structure` has, or the facts not derived and checked — so that a user
reads the reason instead of every table's mismatch. Removing an entry is how a family's support starts.
"""

from __future__ import annotations

_ENCODER_DECODER = ("an encoder–decoder: the decoder's residual stream and the encoder's are separate spaces and the "
                    "decoder's cross-attention reads the encoder's stream through its key/value projections; no table "
                    "describes two streams and cross-attention yet")
_MLA = ("multi-head latent attention: queries and keys/values pass through low-rank latent projections with a norm "
        "between them (q_a_layernorm, kv_a_layernorm) and a decoupled RoPE part shared by every head; no table "
        "describes these latent spaces yet")
_LLAMA4 = ("Llama-4 interleaves layers without RoPE and chunked attention, and its Mixture-of-Experts layers (a shared "
           "expert beside routed experts with a sigmoid router) store their banks in a layout no table describes yet "
           "(the Mixture-of-Experts tables: Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GraniteMoE)")

REFUSED: dict[str, str] = {
    **dict.fromkeys(("t5", "mt5", "umt5", "bart", "mbart", "whisper", "marian", "pegasus", "m2m_100", "nllb_moe"),
                    _ENCODER_DECODER),
    **dict.fromkeys(("minicpm3", "deepseek_v2", "deepseek_v3", "kimi_k2"), _MLA),
    **dict.fromkeys(("llama4", "llama4_text"), _LLAMA4),
    "mamba": ("a selective state-space model: its depthwise causal convolution, the x_proj split into Δ, B and C, and "
              "the per-channel A_log and D tie the channels of in_proj's two halves together; which channel "
              "permutations are symmetries of a selective-scan block has not been derived and checked, so none is "
              "offered rather than one guessed"),
    "mamba2": "a selective state-space model (Mamba-2: grouped B/C heads and a gated RMSNorm over the SSM output); "
              "see mamba",
    "deberta-v2": ("disentangled attention: relative position embeddings pass through each layer's own query/key "
                   "projections (share_att_key), so the stream and the position table meet inside every layer's Q/K "
                   "in a way no table describes"),
    "albert": ("the embedding size differs from the hidden size (embedding_hidden_mapping_in projects the embeddings "
               "into the stream) and every layer shares one set of weights, so one FFN and attention space serves "
               "every layer; no table describes shared layers"),
    "mobilebert": ("bottleneck blocks: each layer projects the stream into a smaller intra-block size and back, "
                   "with NoNorm (an elementwise affine) instead of LayerNorm; no table describes these spaces"),
    "swin": ("windowed attention with per-head relative position bias tables and patch merging: each stage "
             "concatenates 2×2 neighbouring tokens into 4·C channels, so the stream's space changes between stages; "
             "no table describes stage transitions"),
    "convnext": ("a convolutional network (depthwise convolutions, channels-last LayerNorm, layer scale): no "
                 "transformer table describes it and torch.fx cannot trace transformers' class (control flow on the "
                 "input); timm's ConvNeXt models are traced by modeconn.symmetry_spec(model, example_input)"),
    "convnextv2": "a convolutional network with global response normalisation (GRN); see convnext",
}
"""``model_type`` → why it is refused."""


def refusal(model_type: str, model_class: str) -> str | None:
    """The refusal message for ``model_type`` (``None``: not refused here)."""
    reason = REFUSED.get(model_type)
    if reason is None:
        return None
    return (f"Hugging Face model_type {model_type!r} ({model_class}) is not supported: {reason}. Write a spec by hand "
            "(SymmetrySpec.from_axes) or add an adapter in modeconn/symmetry/hf/")
