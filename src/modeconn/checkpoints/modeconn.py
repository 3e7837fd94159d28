"""``modeconn`` — a modeconn checkpoint (``config.json`` with ``architecture`` and ``kwargs``, ``model.safetensors``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from .base import CheckpointKind, register_kind


def _load(path: Path) -> nn.Module:
    from ..io import load_checkpoint

    return load_checkpoint(path)[0]


def _check_config(config: dict[str, Any], file: Path) -> None:
    from ..io import check_format_version

    check_format_version(config, file)  # a format_version newer than this version reads: ConfigError


KIND = register_kind(CheckpointKind("modeconn", "modeconn", lambda c: isinstance(c.get("architecture"), str), _load,
                                    check_config=_check_config))
