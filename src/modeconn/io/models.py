"""Loading checkpoint directories for alignment (cheap config checks before any weights are read)."""

from __future__ import annotations

from pathlib import Path
from collections.abc import Sequence

import torch
import torch.nn as nn

from ..errors import ConfigError
from .checkpoint import describe_config_mismatch, load_checkpoint, read_config


def load_same_architecture(paths: Sequence[Path]) -> tuple[list[nn.Module], list[dict]]:
    """Load checkpoints that must share one architecture; ConfigError naming the checkpoints and the differing
    config keys (``architecture``, ``kwargs.*``) with both values, before any weights load."""
    configs = [read_config(p) for p in paths]
    arch = lambda c: {"architecture": c.get("architecture"), "kwargs": c.get("kwargs")}  # noqa: E731
    for p, c in zip(paths[1:], configs[1:], strict=False):
        if arch(c) != arch(configs[0]):
            raise ConfigError(f"{describe_config_mismatch(paths[0], arch(configs[0]), p, arch(c))}: alignment and "
                              "merging need models of one architecture")
    return [load_checkpoint(p)[0] for p in paths], configs


def check_input_shape(expected: Sequence[int] | None, got: Sequence[int], model: str, data: str) -> None:
    """Before any tracing or evaluation: ConfigError when ``data`` (e.g. "dataset 'mnist'") gives examples of shape
    ``got`` but ``model`` (e.g. a checkpoint path) was built for ``expected`` (its ``in_shape``; None: not
    recorded, nothing to check). Shapes exclude the batch axis."""
    if expected is not None and tuple(expected) != tuple(got):
        raise ConfigError(f"{data} gives inputs of shape {tuple(got)} but {model} was built for inputs of shape "
                          f"{tuple(expected)} (in_shape): use the dataset the model was trained on")


def example_input(config: dict) -> torch.Tensor:
    """A batch of 2 inputs of the shape recorded in ``config['kwargs']['in_shape']`` (for tracing): standard
    normal images, or token ids in ``[0, num_classes)`` for the token models (language models)."""
    from ..models import TOKEN_MODELS

    kwargs = config.get("kwargs", {})
    in_shape = kwargs.get("in_shape")
    if not in_shape:
        raise ConfigError("config.json has no kwargs.in_shape to trace the model with; pass --dataset")
    gen = torch.Generator().manual_seed(0)
    if config.get("architecture") in TOKEN_MODELS:
        return torch.randint(0, int(kwargs.get("num_classes", 2)), (2, *in_shape), generator=gen)
    return torch.randn(2, *in_shape, generator=gen)
