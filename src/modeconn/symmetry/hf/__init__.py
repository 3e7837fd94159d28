"""Hugging Face transformer adapters: a declarative symmetry spec per model family.

    spec = modeconn.symmetry_spec(hf_model)            # dispatches here for transformers models
    spec = modeconn.symmetry.hf.hf_symmetry_spec(model, groups={"qk": None})

Design (see :mod:`.structure` and :mod:`.builder`): one adapter module per family (``gpt_neox``, ``gpt2``,
``llama``, ``bert``, ``vit``), registered in :data:`ADAPTERS` by ``config.model_type``, *describes* the model
(residual writers/norms/readers, attention heads with Q/K/V/O slices, rotary dims and GQA groups, FFNs,
tied tensors) without choosing a group; :func:`build_spec` turns that description into a
:class:`HFSymmetrySpec` for the requested group per role. Importing this package does not import
``transformers``; a model is recognised as an HF model only if ``transformers`` is already imported.
"""

from . import albert, bert, convnext, deberta, families, gpt2, mamba, mla, mobilebert, seq2seq, swin, vit, wrappers  # noqa: F401  (register the adapters)
from ._common import ScaleFreeRMSNorm
from .builder import FULL_GROUPS, ROLES, SUPPORTED, HFSymmetrySpec, build_spec, resolve_groups
from .registry import (
    ADAPTERS,
    Adapter,
    check_same_config,
    config_differences,
    describe,
    example_inputs,
    find_hf_model,
    adapter_for,
    get_adapter,
    hf_symmetry_spec,
    supported_model_types,
    tied_aliases,
)
from .structure import FFN, Attention, Hidden, KVHead, LinearRef, NormRef, QueryHead, Slice, Stream, Structure

__all__ = [
    "ADAPTERS",
    "FFN",
    "FULL_GROUPS",
    "ROLES",
    "SUPPORTED",
    "Adapter",
    "Attention",
    "HFSymmetrySpec",
    "Hidden",
    "KVHead",
    "LinearRef",
    "NormRef",
    "QueryHead",
    "ScaleFreeRMSNorm",
    "Slice",
    "Stream",
    "Structure",
    "build_spec",
    "check_same_config",
    "config_differences",
    "describe",
    "example_inputs",
    "find_hf_model",
    "adapter_for",
    "get_adapter",
    "hf_symmetry_spec",
    "resolve_groups",
    "supported_model_types",
    "tied_aliases",
]
