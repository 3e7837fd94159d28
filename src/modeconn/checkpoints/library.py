"""What the kinds of other libraries' model directories share (:mod:`.timm`, :mod:`.torchvision`): image inputs of a
recorded ``(C, H, W)`` size, weights loaded strictly into the library's own model, and outputs written as the same
kind — the source's ``config.json`` kept as the library wrote it, modeconn's records under its ``"modeconn"`` key (the
libraries ignore it), the weights as ``model.safetensors``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from .base import Checkpoint

RECORD_KEY = "modeconn"
"""``config.json`` key under which modeconn records what it did (alignment, merge) in another library's config."""


def require(module: str, file: Any):
    """The imported ``module`` (``timm``, ``torchvision``) that reads ``file``'s kind; ConfigError naming what to install
    when it is missing."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{file}: reading this checkpoint needs {module}: pip install {module}") from None


def image_size(size: Any, where: str) -> tuple[int, int, int]:
    """``size`` as a ``(C, H, W)`` tuple of positive ints; ConfigError naming ``where`` otherwise."""
    if (not isinstance(size, Sequence) or len(size) != 3
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in size)):
        raise ConfigError(f"{where}: expected an input size [channels, height, width] of positive integers, got {size!r}")
    return tuple(size)


def example_images(size: tuple[int, int, int]) -> torch.Tensor:
    """A batch of 2 standard normal images of ``size`` (seeded: the same every call)."""
    return torch.randn(2, *size, generator=torch.Generator().manual_seed(0))


def image_shape(size: tuple[int, int, int], fixed: bool) -> tuple:
    """The input shape a model of input ``size`` takes: the channels always, height and width only when ``fixed``."""
    return size if fixed else (size[0], None, None)


def load_weights(model: nn.Module, path: Path) -> nn.Module:
    """``model`` with the weights of directory ``path`` loaded strictly (:func:`modeconn.io.load_weights_into`:
    ``model.safetensors``, or one ``.pth``/``.pt``/``.bin`` read with ``torch.load(weights_only=True)``), in eval
    mode."""
    from ..io import load_weights_into

    load_weights_into(model, path, allow_pickle=True)
    return model.eval()


def save_as_source(out: Path, model: nn.Module, source: Checkpoint, *, config: Mapping[str, Any],
                   keep_source: bool = False, metrics: Mapping[str, Any] | None = None,
                   extra_json: Mapping[str, Any] | None = None, overwrite: bool = False, inputs: Iterable[Path] = (),
                   command: str = "save") -> Path:
    """Write ``model`` as a directory of ``source``'s kind (its ``config.json`` with ``config`` recorded under
    :data:`RECORD_KEY` — after the source's own record with ``keep_source`` —, ``model.safetensors``), atomically
    (:func:`modeconn.io.write_model_directory`)."""
    from ..io import write_model_directory

    record = dict(source.config.get(RECORD_KEY) or {}) if keep_source else {}
    cfg = {k: v for k, v in source.config.items() if k != RECORD_KEY} | {RECORD_KEY: record | dict(config)}
    return write_model_directory(out, cfg, model.state_dict(), metrics=metrics, extra_json=extra_json,
                                 overwrite=overwrite, inputs=inputs, command=command)
