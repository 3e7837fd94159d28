"""The ``transformers`` config of a Hugging Face checkpoint directory, read locally and checked (absorbed
checkpoints included)."""

from __future__ import annotations

import os
from collections.abc import Sequence
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


def check_same_hf_configs(paths: Sequence[PathLike], vocab_size: int | None = None) -> list:
    """The configs of ``paths`` (see :func:`hf_config`); ConfigError naming every field that differs from the first
    (fields that do not change the computed function — names, dtype, attention backend … — are ignored). With
    ``vocab_size`` (models merged into one new vocabulary), every config's vocabulary size is set to it first."""
    from . import config_differences

    configs = [hf_config(p) for p in paths]
    if vocab_size is not None:
        for cfg in configs:
            cfg.get_text_config().vocab_size = vocab_size
    problems = []
    for p, cfg in zip(paths[1:], configs[1:], strict=False):
        problems += [f"{p}: {d}" for d in config_differences(configs[0], cfg)]
    if problems:
        raise ConfigError(f"the checkpoints are not the same architecture as {paths[0]}:\n  " + "\n  ".join(problems))
    return configs
