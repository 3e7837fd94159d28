"""The experiments' shared training step: models of one architecture trained from a list of seeds."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn

from ..data import DatasetBundle
from ..models import build_model
from ..train import TrainConfig, fit


def train_models(arch: str, bundle: DatasetBundle, seeds: Sequence[int], train: Mapping[str, Any], *,
                 in_shape: tuple[int, ...] | None = None, log: Callable[[str], None] | None = None,
                 label: str = "model", **kwargs: Any) -> list[nn.Module]:
    """One ``arch`` model per seed (initialisation and data order), built with ``kwargs`` and trained on
    ``bundle.train`` with ``TrainConfig(seed=seed, **train)``; returned in eval mode, in the order of ``seeds``.

    ``in_shape`` defaults to the bundle's input shape. ``log`` gets one line per trained model.
    Raises ConfigError for bad architecture kwargs or training options (before any training).
    """
    models = []
    for seed in seeds:
        m = build_model(arch, in_shape=tuple(in_shape or bundle.input_shape), num_classes=bundle.num_classes,
                        seed=seed, **kwargs)
        fit(m, bundle.train, TrainConfig(seed=seed, **train), progress=False)
        models.append(m.eval())
        if log is not None:
            log(f"trained {label} seed {seed}")
    return models
