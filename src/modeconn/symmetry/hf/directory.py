"""The ``transformers`` config of a Hugging Face checkpoint directory, read locally and checked (absorbed
checkpoints included)."""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from pathlib import Path

from ...errors import ConfigError
from ...io import CONFIG_NAME, read_json_object

PathLike = str | os.PathLike


def hf_config(path: PathLike):
    """The ``transformers`` config of a Hugging Face checkpoint directory (read locally; never runs remote code: a
    ``model_type`` transformers does not implement is refused before transformers reads the file, and it is read with
    ``trust_remote_code=False``). For an absorbed checkpoint, the config of its original model type with the
    ``modeconn_absorbed`` record (:func:`~modeconn.symmetry.absorb.read_absorbed_config`).
    Raises CheckpointError (no/invalid config.json), ConfigError (no ``model_type``, one transformers does not
    implement — with ``auto_map``, named as custom code never run —, a malformed absorbed record: the file and the
    field are named)."""
    from ..absorb import is_absorbed_config, read_absorbed_config
    from .config_check import check_model_type, config_value_errors, validate_hf_config

    path = Path(path)
    raw = read_json_object(path / CONFIG_NAME, "config file")
    if is_absorbed_config(raw):
        return read_absorbed_config(raw, path / CONFIG_NAME)
    if not isinstance(raw.get("model_type"), str):
        raise ConfigError(f"{path / CONFIG_NAME}: no 'model_type'; not a Hugging Face checkpoint directory")
    check_model_type(raw, path / CONFIG_NAME)  # before transformers, which would offer to run auto_map's code
    validate_hf_config(raw, path / CONFIG_NAME)  # sizes: positive ints, divisible, bounded (before transformers)
    import transformers

    try:
        return transformers.AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (OSError, *config_value_errors()) as err:
        raise ConfigError(f"{path / CONFIG_NAME}: transformers cannot read this config "
                          f"(model_type {raw['model_type']!r}): {err}") from None


EXPLAINED_FIELDS = {
    "tie_word_embeddings": "a tied model's output head is its input embedding, an untied one stores its own, e.g. "
                           "lm_head.weight: the heads cannot be paired",
}
"""Config fields whose difference is explained after it in :func:`check_same_hf_configs`'s error."""


def check_same_hf_configs(paths: Sequence[PathLike], vocab_size: int | None = None,
                          free: Collection[str] = ()) -> list:
    """The configs of ``paths`` (see :func:`hf_config`); ConfigError naming every field that differs from the first
    (fields that do not change the computed function — names, dtype, attention backend … — are ignored; so are the
    ``free`` fields, those the command changes, e.g. fuse's FFN width), with the file of each and, for a field of
    :data:`EXPLAINED_FIELDS`, what the difference means. With ``vocab_size`` (models merged into one new vocabulary),
    every config's vocabulary size is set to it first."""
    configs = [hf_config(p) for p in paths]
    if vocab_size is not None:
        for cfg in configs:
            cfg.get_text_config().vocab_size = vocab_size
    problems = []
    for p, cfg in zip(paths[1:], configs[1:], strict=False):
        problems += [f"{p}: {d}" for d in _differences(configs[0], cfg, free)]
    if problems:
        apart = f" (apart from {', '.join(free)})" if free else ""
        raise ConfigError(f"the checkpoints are not the same architecture as {paths[0]}{apart}:\n  "
                          + "\n  ".join(problems))
    return configs


def _differences(config_a, config_b, free: Collection[str]) -> list[str]:
    """:func:`~modeconn.symmetry.hf.config_differences` of two configs but the ``free`` fields, each difference in a
    field of :data:`EXPLAINED_FIELDS` followed by its explanation."""
    from . import config_differences

    da, db = ({k: v for k, v in c.to_dict().items() if k not in free} for c in (config_a, config_b))
    lines = config_differences(da, db)
    return [next((f"{line} ({why})" for key, why in EXPLAINED_FIELDS.items() if line.startswith(f"config.{key}:")),
                 line) for line in lines]


def check_same_tensor_names(paths: Sequence[PathLike]) -> None:
    """StateDictMismatchError, from the weight files' headers only, when a checkpoint stores a tensor the first does
    not or lacks one it stores (e.g. an output head ``lm_head.weight`` in one model only): each name with its file."""
    from ...errors import StateDictMismatchError
    from ...io.lazy import LazyCheckpoint

    names = [set(LazyCheckpoint(p).infos) for p in paths]
    problems = []
    for p, own in zip(paths[1:], names[1:], strict=False):
        problems += [f"{p} stores {k}, {paths[0]} does not" for k in sorted(own - names[0])]
        problems += [f"{paths[0]} stores {k}, {p} does not" for k in sorted(names[0] - own)]
    if problems:
        raise StateDictMismatchError("the checkpoints do not store the same tensors:\n  " + "\n  ".join(problems))


def check_same_hf_checkpoints(paths: Sequence[PathLike], free: Collection[str] = ()) -> list:
    """Every check of a set of Hugging Face checkpoints that one command combines, before any weights are read: the
    configs agree but for the ``free`` fields (:func:`check_same_hf_configs`), then the stored tensor names
    (:func:`check_same_tensor_names`). Returns the configs."""
    configs = check_same_hf_configs(paths, free=free)
    check_same_tensor_names(paths)
    return configs
