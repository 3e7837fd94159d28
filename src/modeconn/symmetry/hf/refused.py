"""Model types refused with the reason, before the automatic fallback (:mod:`.infer`) tries any layout.

Each entry states why no registered layout can describe the model type's symmetries yet — the spaces it would need
that no :class:`~modeconn.symmetry.hf.structure.Structure` has, or the facts not derived and checked — so that a user
reads the reason instead of every table's mismatch. Removing an entry is how a family's support starts.
"""

from __future__ import annotations

_SINUSOIDAL = ("sinusoidal position embeddings added to both residual streams are recomputed when the model is built "
               "(a buffer, or a table not saved in the checkpoint), so they stay in a fixed channel order: no "
               "permutation of a stream survives saving and loading, and none is offered")
_MOE = ("a Mixture-of-Experts model whose expert layout no table describes yet (the Mixture-of-Experts tables: "
        "Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GraniteMoE)")
_LLAMA4 = ("Llama-4 interleaves layers without RoPE and chunked attention, and its Mixture-of-Experts layers (a shared "
           "expert beside routed experts with a sigmoid router) store their banks in a layout no table describes yet "
           "(the Mixture-of-Experts tables: Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GraniteMoE)")

REFUSED: dict[str, str] = {
    **dict.fromkeys(("m2m_100", "marian"), _SINUSOIDAL),
    "nllb_moe": _MOE,
    "kimi_k2": _MOE + " (DeepSeek-V3's layout: dense DeepSeek-V2/V3 configurations are supported)",
    **dict.fromkeys(("llama4", "llama4_text"), _LLAMA4),
    "mamba2": ("a Mamba-2 selective state-space model: B and C are shared by groups of heads (n_groups), the time "
               "step is per head, and a gated RMSNorm over groups of channels follows the scan; which head, channel "
               "and group permutations keep it has not been derived and checked (Mamba-1 is supported), so none is "
               "offered rather than one guessed"),
    "convnextv2": ("ConvNeXt-V2's global response normalisation (GRN) scales each channel by its spatial norm "
                   "relative to the mean over channels, with per-channel parameters; its symmetries have not been "
                   "derived and checked for transformers' class (ConvNeXt-V1 is supported)"),
}
"""``model_type`` → why it is refused."""


def refusal(model_type: str, model_class: str) -> str | None:
    """The refusal message for ``model_type`` (``None``: not refused here)."""
    reason = REFUSED.get(model_type)
    if reason is None:
        return None
    return (f"Hugging Face model_type {model_type!r} ({model_class}) is not supported: {reason}. Write a spec by hand "
            "(SymmetrySpec.from_axes) or add an adapter in modeconn/symmetry/hf/")
