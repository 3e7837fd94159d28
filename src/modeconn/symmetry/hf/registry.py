"""Adapter registry (keyed by ``config.model_type``), model discovery, spec entry points, config checks."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from ...errors import ConfigError, SpecError, UnsupportedOperationError
from ...registry import Registry
from .builder import Groups, HFSymmetrySpec, build_spec, resolve_groups, storage_key
from .structure import Structure


@dataclass(frozen=True)
class Adapter:
    """One model family.

    ``describe(hf_model, prefix)`` walks the model and returns its :class:`Structure` (keys prefixed by
    ``prefix``); ``example(hf_model, generator)`` gives keyword inputs for a cheap forward;
    ``classes`` lists the supported model classes; ``absorb`` is ``None`` if
    :func:`modeconn.absorb_normalization` supports the family, else the reason it does not; ``groups``: the groups
    per role shown to keep the model's function (an inferred layout, :mod:`.infer`), ``None`` for every group the
    builder supports (a registered adapter).
    """

    family: str
    describe: Callable[[nn.Module, str], Structure]
    example: Callable[[nn.Module, torch.Generator], dict[str, torch.Tensor]]
    classes: tuple[str, ...]
    absorb: str | None = None
    groups: Mapping[str, tuple[str, ...]] | None = None


ADAPTERS: Registry[Adapter] = Registry("Hugging Face adapter")


def supported_model_types() -> list[str]:
    return ADAPTERS.names()


def adapter_for(hf: nn.Module) -> Adapter:
    """The adapter of the Hugging Face model ``hf``: registered for its ``model_type``, else inferred from a registered
    layout and checked on a small random instance (:func:`modeconn.symmetry.hf.infer.infer_adapter`).

    Raises UnsupportedOperationError with the reason for a model type refused outright
    (:data:`~modeconn.symmetry.hf.refused.REFUSED`), else naming what each registered layout could not match."""
    model_type = getattr(hf.config, "model_type", "?")
    if model_type in ADAPTERS:
        return ADAPTERS.get(model_type)
    from .infer import infer_adapter
    from .refused import refusal

    why = refusal(model_type, type(hf).__name__)
    if why is not None:
        raise UnsupportedOperationError(why)

    return infer_adapter(hf)


def get_adapter(model_type: str, model_class: str = "?") -> Adapter:
    """The adapter registered for ``model_type``; UnsupportedOperationError listing the supported types otherwise."""
    if model_type not in ADAPTERS:
        raise UnsupportedOperationError(
            f"no symmetry adapter for Hugging Face model_type {model_type!r} ({model_class}); supported "
            f"model types: {', '.join(supported_model_types())}. Write a spec by hand (SymmetrySpec.from_axes) "
            "or add an adapter in modeconn/symmetry/hf/"
        )
    return ADAPTERS.get(model_type)


def pretrained_class() -> type | None:
    """``transformers.PreTrainedModel`` if transformers is imported, else ``None``."""
    tf = sys.modules.get("transformers")  # not imported → no model can be a transformers model
    return getattr(tf, "PreTrainedModel", None) if tf is not None else None


def find_hf_model(model: nn.Module) -> tuple[str, nn.Module] | None:
    """``(prefix, hf_model)`` if ``model`` is a ``transformers.PreTrainedModel`` (prefix ``""``) or wraps
    exactly one as a submodule (prefix: its path); ``None`` otherwise.

    Raises SpecError if the wrapper holds several HF models, or tensors outside the HF model (the adapter
    cannot know how they transform).
    """
    cls = pretrained_class()
    if cls is None or not isinstance(model, nn.Module):
        return None
    if isinstance(model, cls):
        return "", model
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, cls)]
    top = [(n, m) for n, m in found if not any(n.startswith(o + ".") for o, _ in found if o != n)]
    if not top:
        return None
    if len(top) > 1:
        raise SpecError(
            f"{type(model).__name__} wraps {len(top)} Hugging Face models ({[n for n, _ in top]}); "
            "a spec covers one model: build one per submodule"
        )
    prefix, hf = top[0]
    outside = [k for k in model.state_dict() if not k.startswith(prefix + ".")]
    if outside:
        raise SpecError(
            f"{type(model).__name__} wraps the Hugging Face model {prefix!r} but also holds tensors the adapter "
            f"cannot bind: {outside}"
        )
    return prefix, hf


def _require_hf(model: nn.Module) -> tuple[str, nn.Module]:
    found = find_hf_model(model)
    if found is None:
        raise ConfigError(
            f"{type(model).__name__} is not a transformers.PreTrainedModel and wraps none; "
            "use modeconn.symmetry_spec(model, example_input) to trace it"
        )
    return found


def tied_aliases(state_dict: dict[str, torch.Tensor]) -> dict[str, str]:
    """``alias → primary`` for state-dict entries sharing storage (tied weights; the first key is primary).
    Works on models built on the meta device too (storage identity instead of the data pointer, which is 0 there)."""
    seen: dict[tuple, str] = {}
    out: dict[str, str] = {}
    for k, t in state_dict.items():
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        sig = (*storage_key(t), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if sig in seen:
            out[k] = seen[sig]
        else:
            seen[sig] = k
    return out


def describe(model: nn.Module) -> Structure:
    """The :class:`Structure` of an HF model (or of a module wrapping exactly one), tied tensors included.

    Raises UnsupportedOperationError (model type without adapter, listing the supported ones; layout the
    adapter does not know), SpecError (unsupported config option, naming the field).
    """
    prefix, hf = _require_hf(model)
    st = adapter_for(hf).describe(hf, prefix)
    return replace(st, aliases=tied_aliases(model.state_dict()))


def hf_symmetry_spec(
    model: nn.Module, groups: Groups = "permutation", *, permute_outputs: bool = False
) -> HFSymmetrySpec:
    """The symmetry spec of a Hugging Face transformer (or a module wrapping exactly one), from its adapter.

    Args:
        model: a supported ``transformers.PreTrainedModel`` (see :func:`supported_model_types`) or a module
            containing exactly one (state-dict keys prefixed by its path) and no other tensors.
        groups: ``"permutation"`` (default) or ``{role: group or None}``, see
            :mod:`modeconn.symmetry.hf.builder`.
        permute_outputs: also act on a residual stream that is the model's output (base models).
    Returns: a validated :class:`HFSymmetrySpec` (with activation probes; no REPAIR points).
    Raises: see :func:`describe` and :func:`~modeconn.symmetry.hf.builder.build_spec`; SpecError naming the role and
        group when the model's layout was inferred (:mod:`.infer`) and that group was not shown to keep its function.
    """
    st = describe(model)
    _require_verified(adapter_for(_require_hf(model)[1]), resolve_groups(groups))
    return build_spec(st, model.state_dict(), groups, permute_outputs=permute_outputs)


def _require_verified(adapter: Adapter, chosen: Mapping[str, str | None]) -> None:
    if adapter.groups is None:
        return
    bad = [f"{role}={g}" for role, g in chosen.items() if g is not None and g not in adapter.groups.get(role, ())]
    if bad:
        raise SpecError(
            f"{adapter.family}: the groups {bad} were not shown to keep this model's function (its layout is inferred "
            f"and only these were verified on a random instance: {dict(adapter.groups)}); request only those, or add "
            "an adapter for its model_type"
        )


def example_inputs(model: nn.Module, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """Small fixed inputs for a forward of the HF model inside ``model`` (token ids, pixel values …)."""
    _, hf = _require_hf(model)
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    return adapter_for(hf).example(hf, gen)


# config fields that do not change the function computed by the weights
_IGNORED_CONFIG_FIELDS = {
    "_name_or_path", "name_or_path", "transformers_version", "architectures", "torch_dtype", "dtype",
    "_attn_implementation", "_attn_implementation_autoset", "_attn_implementation_internal", "_commit_hash",
    "use_cache", "output_attentions", "output_hidden_states", "return_dict", "id2label", "label2id",
    "gradient_checkpointing", "_experts_implementation",
}
# token ids and generation settings: base and instruct checkpoints of one model differ here (special tokens, chat
# defaults), never in what the weights compute
TOKEN_AND_GENERATION_FIELDS = {
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "unk_token_id", "cls_token_id", "mask_token_id",
    "decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id", "suppress_tokens", "begin_suppress_tokens",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "remove_invalid_values", "exponential_decay_length_penalty", "task_specific_params",
    "tokenizer_class", "prefix", "finetuning_task", "generation_config", "chunk_size_feed_forward",
}
# the structural fields, reported first: the difference that explains every other one
_STRUCTURAL = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings")


def check_same_config(model_a: nn.Module, model_b: nn.Module) -> None:
    """Raise ConfigError naming every differing config field (and the model classes if they differ).

    Two endpoints must be the same architecture for a shared spec; fields that do not affect the computed
    function (names, dtype, attention backend, cache flags, label names) are ignored.
    """
    (_, a), (_, b) = _require_hf(model_a), _require_hf(model_b)
    problems = []
    if type(a) is not type(b):
        problems.append(f"model classes differ: {type(a).__name__} vs {type(b).__name__}")
    problems += config_differences(a.config, b.config)
    if problems:
        raise ConfigError("the two models differ:\n  " + "\n  ".join(problems))


def config_differences(config_a: Any, config_b: Any) -> list[str]:
    """``["config.FIELD: value_a vs value_b", …]`` for every field (of two ``PretrainedConfig`` objects or plain
    dicts) that differs — structural fields (sizes, layer and head counts, vocabulary, model type) first — ignoring
    fields that do not change the function computed by the weights (names, dtype, attention backend, cache flags,
    label names, and the token ids and generation settings of :data:`TOKEN_AND_GENERATION_FIELDS`)."""
    da, db = _config_dict(config_a), _config_dict(config_b)
    ignored = _IGNORED_CONFIG_FIELDS | TOKEN_AND_GENERATION_FIELDS
    keys = [k for k in set(da) | set(db) if k not in ignored and da.get(k, "<absent>") != db.get(k, "<absent>")]
    rank = {k: i for i, k in enumerate(_STRUCTURAL)}
    keys.sort(key=lambda k: (rank.get(k, len(rank)), k))
    return [f"config.{k}: {da.get(k, '<absent>')!r} vs {db.get(k, '<absent>')!r}" for k in keys]


def _config_dict(cfg: Any) -> dict[str, Any]:
    if isinstance(cfg, dict):
        return cfg
    return cfg.to_dict() if hasattr(cfg, "to_dict") else dict(vars(cfg))
