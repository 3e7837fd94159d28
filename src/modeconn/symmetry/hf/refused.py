"""Model types refused with the reason, before the automatic fallback (:mod:`.infer`) tries any layout.

Each entry states why no registered layout can describe the model type's symmetries yet — the spaces it would need
that no :class:`~modeconn.symmetry.hf.structure.Structure` has, or the facts not derived and checked — so that a user
reads the reason instead of every table's mismatch. Removing an entry is how a family's support starts.
"""

from __future__ import annotations

_SINUSOIDAL = ("sinusoidal position embeddings added to both residual streams are recomputed when the model is built "
               "(a buffer, or a table not saved in the checkpoint), so they stay in a fixed channel order: no "
               "permutation of a stream survives saving and loading, and none is offered")
_MOE = ("a Mixture-of-Experts model: its expert spaces and the router are described under the Mixture-of-Experts "
        "support, not by the dense tables")

REFUSED: dict[str, str] = {
    **dict.fromkeys(("m2m_100", "marian"), _SINUSOIDAL),
    "nllb_moe": _MOE,
    "kimi_k2": _MOE + " (DeepSeek-V3's layout: dense DeepSeek-V2/V3 configurations are supported)",
    **dict.fromkeys(("llama4", "llama4_text"), _MOE + "; Llama-4 also interleaves layers without RoPE and chunked "
                                                     "attention"),
    "mamba": ("a selective state-space model: its depthwise causal convolution, the x_proj split into Δ, B and C, and "
              "the per-channel A_log and D tie the channels of in_proj's two halves together; which channel "
              "permutations are symmetries of a selective-scan block has not been derived and checked, so none is "
              "offered rather than one guessed"),
    "mamba2": "a selective state-space model (Mamba-2: grouped B/C heads and a gated RMSNorm over the SSM output); "
              "see mamba",
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
