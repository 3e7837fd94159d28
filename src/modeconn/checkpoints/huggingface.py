"""``huggingface`` — a ``save_pretrained`` directory (``config.json`` with ``model_type``; ``model.safetensors`` or
shards with ``model.safetensors.index.json``). Read lazily, tensor by tensor (:meth:`~.base.Checkpoint.lazy`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from .base import CONFIG_NAME, CheckpointKind, register_kind


def _load(path: Path) -> nn.Module:
    from ..checks import check_finite_stored
    from ..io.lazy import LazyCheckpoint
    from ..symmetry.hf.config_check import model_class
    from ..symmetry.hf.directory import hf_config

    cfg = hf_config(path)  # first: refuses a model type transformers does not implement (auto_map: never run)
    cls = model_class(cfg, path / CONFIG_NAME, required=True)  # transformers' own class for the model type only
    stored = LazyCheckpoint(path).infos  # headers only: which file holds each tensor, for the error message
    model = cls.from_pretrained(path, local_files_only=True, trust_remote_code=False).eval()
    for key, t in model.state_dict().items():  # checked in memory: the weights are not read a second time
        info = stored.get(key)
        check_finite_stored(t, path / info.shard if info is not None else path, key)
    return model


def _detect(config: dict[str, Any]) -> bool:
    return isinstance(config.get("model_type"), str) and "architecture" not in config


KIND = register_kind(CheckpointKind("huggingface", "Hugging Face", _detect, _load, streams=True))
