"""Loading checkpoint directories for alignment (cheap config checks before any weights are read)."""

from __future__ import annotations

from pathlib import Path
from collections.abc import Sequence

import torch
import torch.nn as nn

from ..errors import ConfigError
from ..io import load_checkpoint, read_config


def load_same_architecture(paths: Sequence[Path]) -> tuple[list[nn.Module], list[dict]]:
    """Load checkpoints that must share one architecture; ConfigError naming both before any weights load."""
    configs = [read_config(p) for p in paths]
    ref = (configs[0].get("architecture"), configs[0].get("kwargs"))
    for p, c in zip(paths[1:], configs[1:], strict=False):
        if (c.get("architecture"), c.get("kwargs")) != ref:
            raise ConfigError(
                f"{p} is {c.get('architecture')} {c.get('kwargs')} but {paths[0]} is {ref[0]} {ref[1]}: "
                "alignment and merging need models of one architecture"
            )
    return [load_checkpoint(p)[0] for p in paths], configs


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
