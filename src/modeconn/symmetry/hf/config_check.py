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

No remote code: a model type, config class or model class named in a file resolves only to what transformers itself
implements (:func:`config_class`, :func:`model_class`), every transformers call passes ``trust_remote_code=False``,
and a config whose ``model_type`` transformers does not implement is refused before transformers sees it (which would
otherwise offer, on stdin, to import the Python file its ``auto_map`` names).

Every failure is a :class:`~modeconn.errors.ConfigError` naming the file and the field.
"""

from __future__ import annotations

import functools
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
"""Config fields holding sizes: when present (and not ``null``) each must be an integer ≥ 1 (those of
:data:`LIST_FIELDS` may also be a list of such integers)."""
LIST_FIELDS = ("image_size", "patch_size", "num_heads")
"""Size fields that may be a list: image and patch sizes per dimension, heads per stage (Swin)."""
NULLABLE_FIELDS = ("num_key_value_heads", "head_dim", "intermediate_size", "n_inner", "ffn_dim",
                   "max_position_embeddings", "n_positions", "n_ctx")
"""Size fields that may be ``null`` (transformers then derives them: kv heads = heads, n_inner = 4·hidden …)."""
NONNEGATIVE_FIELDS = ("type_vocab_size",)
"""Size fields that may be 0."""


def _positive_int(value: Any, minimum: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def invalid_field(file: str | os.PathLike, field: str, value: Any, what: str) -> ConfigError:
    """The ConfigError of a config field: ``"<file>: config.<field>=<value> is invalid: <what>"``."""
    return ConfigError(f"{file}: config.{field}={value!r} is invalid: {what}")


def config_value_errors() -> tuple[type[Exception], ...]:
    """The exceptions transformers raises for a config value it refuses (huggingface_hub's field validation error
    in transformers ≥ 5, plain ValueError / TypeError / KeyError before)."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # older huggingface_hub
        return ValueError, TypeError, KeyError
    return ValueError, TypeError, KeyError, StrictDataclassError


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
        items = value if field in LIST_FIELDS and isinstance(value, list) and value else [value]
        if not all(_positive_int(v, minimum) for v in items):
            raise invalid_field(file, field, value, f"a size must be an integer ≥ {minimum} (not a string, float or bool)")
    hidden_field, hidden = _first(cfg, HIDDEN_FIELDS)
    heads_field, heads = _first(cfg, HEAD_FIELDS)
    kv = cfg.get("num_key_value_heads")
    if isinstance(heads, list):  # heads per stage (Swin): each stage has its own width
        heads = None
    if hidden is not None and heads is not None and cfg.get("head_dim") is None and hidden % heads:
        raise invalid_field(file, hidden_field, hidden, f"not divisible by config.{heads_field}={heads} (the head size "
                                                        "would not be an integer)")
    if heads is not None and kv is not None and heads % kv:
        raise invalid_field(file, "num_key_value_heads", kv, f"config.{heads_field}={heads} is not a multiple of it "
                                                             "(every key/value head serves the same number of query heads)")
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


def _stored_layers(config: Any) -> tuple[str, Any]:
    """``(field, layers the checkpoint stores)``: ALBERT applies ``num_hidden_groups × inner_group_num`` stored layers
    over its whole depth; other configs store every layer."""
    groups, inner = getattr(config, "num_hidden_groups", None), getattr(config, "inner_group_num", None)
    if _positive_int(groups) and _positive_int(inner):
        return "num_hidden_groups", groups * inner
    return _layers(config)


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
    field, layers = _stored_layers(config)
    if _positive_int(layers) and layers * MIN_TENSORS_PER_LAYER > n_tensors:
        raise ConfigError(f"{file}: config.{field}={layers} but the checkpoint holds only {n_tensors} tensors (every "
                          f"layer stores at least {MIN_TENSORS_PER_LAYER}); the config does not describe these weights")


def config_class(model_type: Any, file: str | os.PathLike, field: str = "model_type", auto_map: Any = None) -> type:
    """transformers' own config class for ``model_type`` (``CONFIG_MAPPING``: the built-in model types and those
    registered in this process) — never a class a checkpoint's ``auto_map`` points at.

    Raises:
        ConfigError: naming ``file`` and ``field`` when ``model_type`` is not a string or not a model type
            transformers implements; with ``auto_map`` (the config's, if any) the message says that the checkpoint
            ships custom code, which modeconn never imports.
    """
    import transformers

    if isinstance(model_type, str) and model_type in transformers.CONFIG_MAPPING:
        return transformers.CONFIG_MAPPING[model_type]
    custom = (f"; its config.auto_map={auto_map!r} names Python code shipped with the checkpoint, which modeconn never "
              "imports (trust_remote_code=False)") if auto_map else ""
    raise ConfigError(f"{file}: config.{field}={model_type!r} is not a model type transformers implements{custom}")


def check_model_type(raw: Mapping[str, Any], file: str | os.PathLike) -> None:
    """ConfigError naming ``file``, ``model_type`` and ``auto_map`` unless the raw config's ``model_type`` is one
    transformers implements (:func:`config_class`): run before transformers reads the file, which would ask on stdin
    whether to run the code ``auto_map`` names."""
    config_class(raw.get("model_type"), file, auto_map=raw.get("auto_map"))


@functools.cache
def _own_model_classes(model_type: str) -> frozenset[str]:
    """The names of transformers' model classes for ``model_type`` in its auto mappings (base, causal LM,
    classification …)."""
    from transformers.models.auto import modeling_auto

    names: set[str] = set()
    for attr, mapping in vars(modeling_auto).items():
        if attr.endswith("_MAPPING_NAMES") and isinstance(mapping, Mapping):
            value = mapping.get(model_type)
            names.update((value,) if isinstance(value, str) else value or ())
    return frozenset(names)


def _declares(cls: type, model_type: Any) -> bool:
    """Whether ``cls`` (a transformers class) is one of transformers' own classes for ``model_type`` by its config
    class (classes outside the auto mappings: ``CLIPVisionModelWithProjection``)."""
    config_class = getattr(cls, "config_class", None)
    return cls.__module__.startswith("transformers.models.") and getattr(config_class, "model_type", None) == model_type


def model_class(config: Any, file: str | os.PathLike, *, required: bool = False) -> type | None:
    """The model class ``config.architectures[0]`` names, resolved only among transformers' own classes for
    ``config.model_type`` (:func:`_own_model_classes`, or a transformers class whose config class is the model
    type's: :func:`_declares`): a name read from a file never reaches a custom class or any
    other object. ``None`` when the config names no architecture (and ``required`` is false).

    Raises:
        ConfigError: naming ``file`` and ``architectures`` when it is not a list of class names, names a class that
            is not one of transformers' for the model type, or is absent while ``required``.
    """
    import transformers

    names = getattr(config, "architectures", None)
    if names is None or names == []:
        if required:
            raise ConfigError(f"{file}: config.architectures is missing: the model class cannot be told")
        return None
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise invalid_field(file, "architectures", names, "must be a list of model class names")
    model_type = getattr(config, "model_type", None)
    cls = getattr(transformers, names[0], None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)
            and (names[0] in _own_model_classes(str(model_type)) or _declares(cls, model_type))):
        raise invalid_field(file, "architectures", names, f"{names[0]!r} is not one of transformers' model classes "
                                                          f"for model_type {model_type!r} (modeconn never loads custom code)")
    return cls


def build_meta_model(config: Any, file: str | os.PathLike):
    """The model a transformers ``config`` describes, built on the meta device (no memory is allocated): the class
    named by ``config.architectures`` (:func:`model_class`; else the causal-LM, else the base auto class).

    Raises:
        ConfigError: naming ``file`` when ``architectures`` names no transformers class for the model type, or
            transformers or torch cannot build a model from the config (a value it refuses: the original error is
            quoted).
    """
    return build_model(config, file, "meta")


def build_model(config: Any, file: str | os.PathLike, device: str = "meta"):
    """:func:`build_meta_model` on ``device`` (``"cpu"``: a model with initialised weights, to load weights into)."""
    import torch
    import transformers

    cls = model_class(config, file)
    try:
        with torch.device(device):
            if cls is not None:
                return cls(config)
            try:
                return transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=False)
            except ValueError:
                return transformers.AutoModel.from_config(config, trust_remote_code=False)
    except (TypeError, ValueError, ZeroDivisionError, RuntimeError, OverflowError, IndexError, KeyError,
            AttributeError) as err:
        raise ConfigError(f"{file}: transformers cannot build a model from this config "
                          f"({type(err).__name__}: {err})") from None
