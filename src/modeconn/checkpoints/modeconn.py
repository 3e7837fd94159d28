"""``modeconn`` — a modeconn checkpoint (``config.json`` with ``architecture`` and ``kwargs``, ``model.safetensors``).

Fed the dataset it records (``config.json``'s ``dataset`` and ``dataset_options``) unless one is named; written by
:func:`modeconn.io.save_checkpoint`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import ConfigError
from .base import Checkpoint, CheckpointKind, register_kind


def _load(path: Path) -> nn.Module:
    from ..io import load_checkpoint

    return load_checkpoint(path)[0]


def _check_config(config: dict[str, Any], file: Path) -> None:
    from ..io import read_config

    read_config(file)  # format_version (ConfigError), 'architecture' and 'kwargs' (CheckpointError): before any weights


def dataset_for(config: dict, dataset: str | None, data: Path | None, limit_train: int | None, load=None):
    """The dataset named by ``dataset`` or recorded in the checkpoint's config (ConfigError if neither, or if its
    examples do not have the shape the model was built for — checked before anything is traced); ``load``: the
    dataset loader (default :func:`modeconn.data.load_dataset`). A ``dataset`` (or recorded one) that is a path is the
    user's image folder (:func:`modeconn.data.user_data_for_checkpoint`)."""
    from ..data import user_data_for_checkpoint, user_data_path
    from ..io.models import check_input_shape

    if (path := user_data_path(dataset or config.get("dataset"))) is not None:  # named, or recorded by train
        return user_data_for_checkpoint(None, config, path, input_shape=config.get("kwargs", {}).get("in_shape"),
                                        limit_train=limit_train)
    if load is None:
        from ..data import load_dataset as load
    name = dataset or config.get("dataset")
    if name is None:
        raise ConfigError("the checkpoint does not record its dataset; pass --dataset")
    bundle = load(name, data, limit_train=limit_train, **config.get("dataset_options", {}))
    recorded = f" (trained on {config['dataset']!r})" if config.get("dataset") else ""
    check_input_shape(config.get("kwargs", {}).get("in_shape"), bundle.input_shape, f"the checkpoint{recorded}",
                      f"dataset {name!r}")
    return bundle


def _dataset(ckpt: Checkpoint, name: str | None, data: Path | None, limit_train: int | None, load=None):
    return dataset_for(ckpt.config, name, data, limit_train, load)


_RESERVED = ("architecture", "kwargs", "modeconn_version", "format_version")


def _save(out: Path, model: nn.Module, source: Checkpoint, *, config: Mapping[str, Any], keep_source: bool = False,
          metrics: Mapping[str, Any] | None = None, extra_json: Mapping[str, Any] | None = None,
          overwrite: bool = False, inputs: Iterable[Path] = (), command: str = "save") -> Path:
    from ..io import save_checkpoint

    kept = {k: v for k, v in source.config.items() if k not in _RESERVED} if keep_source else {}
    return save_checkpoint(out, model, config=kept | dict(config), metrics=metrics, extra_json=extra_json,
                           overwrite=overwrite, inputs=inputs, command=command)


def _example_input(config: dict[str, Any]):
    from ..io.models import example_input

    return example_input(config)


KIND = register_kind(CheckpointKind(
    "modeconn", "modeconn", lambda c: isinstance(c.get("architecture"), str), _load, check_config=_check_config,
    example_input=_example_input, dataset=_dataset, save=_save,
    architecture=lambda c: {"architecture": c.get("architecture"), "kwargs": c.get("kwargs")}))
