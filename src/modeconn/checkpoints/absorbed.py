"""``absorbed`` — a Hugging Face model after normalization absorption (:func:`modeconn.symmetry.save_absorbed`;
``config.json`` has ``model_type`` ``modeconn-absorbed`` or carries ``modeconn_absorbed``). Marked so that stock
transformers refuses it (:mod:`modeconn.symmetry.absorb`): load it with :meth:`~.base.Checkpoint.load`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from .base import CheckpointKind, register_kind


def _load(path: Path) -> nn.Module:
    from ..symmetry.absorb import load_absorbed

    return load_absorbed(path)


def _detect(config: dict[str, Any]) -> bool:
    from ..symmetry.absorb import is_absorbed_config

    return is_absorbed_config(config)


KIND = register_kind(CheckpointKind("absorbed", "absorbed Hugging Face", _detect, _load))
