"""Untrusted Hugging Face ``config.json`` files: sizes checked before a model is built from them.

A malformed config reaches transformers as a TypeError (``"num_hidden_layers": "2"``), a ZeroDivisionError
(``n_head: 0``), torch's RuntimeError (a negative size) or a meta-device build that takes minutes (a huge layer
count: transformers spends milliseconds per layer even on the meta device). Everything here is cheap and runs before
any model is built:

* :func:`validate_hf_config` — on the raw JSON object: every size field the adapters and model classes use (hidden
  size, layers, heads, kv heads, head dim, intermediate size, vocabulary, positions, image/patch size, channels …,
  under their Hugging Face names and GPT-2's aliases) is an integer (``bool`` is not) ≥ 1, the hidden size is
  divisible by the number of heads (unless ``head_dim`` is given) and the heads by the kv heads, and the parameter
  count estimated from the sizes (:func:`estimate_parameters`) is at most :data:`MAX_PARAMETERS`;
* :func:`check_fits_checkpoint` — the layer count is plausible for the checkpoint's tensors (every transformer layer
  stores at least :data:`MIN_TENSORS_PER_LAYER` of them), so a config that does not describe the weights fails in
  milliseconds instead of after building thousands of layers;
* :func:`build_meta_model` — the model class of the config built on the meta device, any error of transformers or
  torch turned into a ConfigError naming the file.

Every failure is a :class:`~modeconn.errors.ConfigError` naming the file and the field.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ...errors import ConfigError

MAX_PARAMETERS = 10**13
"""Refuse configs whose estimated parameter count exceeds this (ten trillion: beyond every published model)."""

MIN_TENSORS_PER_LAYER = 4
"""Every transformer layer stores at least an attention input and output and an FFN input and output weight."""

LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers")
HIDDEN_FIELDS = ("hidden_size", "n_embd", "d_model")
HEAD_FIELDS = ("num_attention_heads", "n_head", "num_heads")
SIZE_FIELDS = (
    *LAYER_FIELDS, *HIDDEN_FIELDS, *HEAD_FIELDS, "num_key_value_heads", "head_dim", "intermediate_size", "n_inner",
    "ffn_dim", "vocab_size", "max_position_embeddings", "n_positions", "n_ctx", "num_channels", "image_size",
    "patch_size", "num_labels",
)
"""Config fields holding sizes: when present (and not ``null``) each must be an integer ≥ 1 (image and patch sizes
may also be a list of such integers)."""
NULLABLE_FIELDS = ("num_key_value_heads", "head_dim", "intermediate_size", "n_inner", "ffn_dim",
                   "max_position_embeddings", "n_positions", "n_ctx")
"""Size fields that may be ``null`` (transformers then derives them: kv heads = heads, n_inner = 4·hidden …)."""
NONNEGATIVE_FIELDS = ("type_vocab_size",)
"""Size fields that may be 0."""


def _positive_int(value: Any, minimum: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _bad(file: str | os.PathLike, field: str, value: Any, what: str) -> ConfigError:
    return ConfigError(f"{file}: config.{field}={value!r} is invalid: {what}")


def _first(cfg: Mapping[str, Any], fields: tuple[str, ...]) -> tuple[str, Any]:
    for f in fields:
        if cfg.get(f) is not None:
            return f, cfg[f]
    return fields[0], None


def validate_hf_config(cfg: Mapping[str, Any], file: str | os.PathLike) -> None:
    """Check the size fields of a raw Hugging Face ``config.json`` object (see the module docstring).

    Raises:
        ConfigError: naming ``file``, the field and its value: a size that is not an integer ≥ 1 (≥ 0 for
            ``type_vocab_size``; a bool, string or float is refused), a hidden size not divisible by the number of
            heads (without ``head_dim``), heads not divisible by kv heads, or an estimated parameter count above
            :data:`MAX_PARAMETERS`.
    """
    for field in (*SIZE_FIELDS, *NONNEGATIVE_FIELDS):
        if field not in cfg or (cfg[field] is None and field in NULLABLE_FIELDS):
            continue
        value, minimum = cfg[field], 0 if field in NONNEGATIVE_FIELDS else 1
        items = value if field in ("image_size", "patch_size") and isinstance(value, list) and value else [value]
        if not all(_positive_int(v, minimum) for v in items):
            raise _bad(file, field, value, f"a size must be an integer ≥ {minimum} (not a string, float or bool)")
    hidden_field, hidden = _first(cfg, HIDDEN_FIELDS)
    heads_field, heads = _first(cfg, HEAD_FIELDS)
    kv = cfg.get("num_key_value_heads")
    if hidden is not None and heads is not None and cfg.get("head_dim") is None and hidden % heads:
        raise _bad(file, hidden_field, hidden, f"not divisible by config.{heads_field}={heads} (the head size would "
                                               "not be an integer)")
    if heads is not None and kv is not None and heads % kv:
        raise _bad(file, "num_key_value_heads", kv, f"config.{heads_field}={heads} is not a multiple of it (every "
                                                    "key/value head serves the same number of query heads)")
    n = estimate_parameters(cfg)
    if n > MAX_PARAMETERS:
        sizes = ", ".join(f"{f}={cfg[f]!r}" for f in SIZE_FIELDS if isinstance(cfg.get(f), int))
        raise ConfigError(f"{file}: the sizes in config.json ({sizes}) describe a model of about {n:.3g} parameters, "
                          f"more than the sanity bound {MAX_PARAMETERS:.0e}; the config is malformed")


def estimate_parameters(cfg: Mapping[str, Any]) -> int:
    """A rough parameter count of a transformer from its raw config sizes (absent sizes count as 1; exact integer
    arithmetic, so absurd sizes cannot overflow): ``L·(4h² + 3h·I) + (2V + P)·h``, with L layers, hidden size h,
    intermediate size I (default 4h), vocabulary V and P positions. Meant for a sanity bound, not for accounting."""

    def size(fields: tuple[str, ...], default: int = 1) -> int:
        v = _first(cfg, fields)[1]
        return v if _positive_int(v) else default

    h = size(HIDDEN_FIELDS)
    layers = size(LAYER_FIELDS)
    inter = size(("intermediate_size", "n_inner", "ffn_dim"), 4 * h)
    vocab = size(("vocab_size",), 0)
    positions = size(("max_position_embeddings", "n_positions"), 0)
    return layers * (4 * h * h + 3 * h * inter) + (2 * vocab + positions) * h


def _layers(config: Any) -> tuple[str, Any]:
    for f in LAYER_FIELDS:
        v = getattr(config, f, None)
        if v is not None:
            return f, v
    return LAYER_FIELDS[0], None


def check_fits_checkpoint(config: Any, file: str | os.PathLike, n_tensors: int) -> None:
    """ConfigError naming ``file`` and the field when the config's layer count needs more tensors than the checkpoint
    holds (``MIN_TENSORS_PER_LAYER`` per layer): a config that does not describe the weights, refused before the
    model is built (building thousands of layers takes minutes even on the meta device)."""
    field, layers = _layers(config)
    if _positive_int(layers) and layers * MIN_TENSORS_PER_LAYER > n_tensors:
        raise ConfigError(f"{file}: config.{field}={layers} but the checkpoint holds only {n_tensors} tensors (every "
                          f"layer stores at least {MIN_TENSORS_PER_LAYER}); the config does not describe these weights")


def build_meta_model(config: Any, file: str | os.PathLike):
    """The model a transformers ``config`` describes, built on the meta device (no memory is allocated): the class
    named by ``config.architectures`` (else the causal-LM, else the base auto class).

    Raises:
        ConfigError: naming ``file`` when transformers or torch cannot build a model from the config (a value it
            refuses: the original error is quoted).
    """
    import torch
    import transformers

    cls = None
    for name in getattr(config, "architectures", None) or ():
        cand = getattr(transformers, name, None)
        if isinstance(cand, type) and issubclass(cand, transformers.PreTrainedModel):
            cls = cand
            break
    try:
        with torch.device("meta"):
            if cls is not None:
                return cls(config)
            try:
                return transformers.AutoModelForCausalLM.from_config(config)
            except ValueError:
                return transformers.AutoModel.from_config(config)
    except (TypeError, ValueError, ZeroDivisionError, RuntimeError, OverflowError, IndexError, KeyError,
            AttributeError) as err:
        raise ConfigError(f"{file}: transformers cannot build a model from this config "
                          f"({type(err).__name__}: {err})") from None
