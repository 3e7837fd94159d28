"""Loading the two endpoints and the data of a data-driven recipe (barrier, path): modeconn checkpoints only."""

from __future__ import annotations

from pathlib import Path

from ..checkpoints import open_checkpoints
from ..errors import ConfigError
from .align import dataset_for


def load_pair_and_data(a: Path, b: Path, command: str, dataset: str | None, data: Path | None,
                       limit_train: int | None):
    """``(model A, model B, A's config, dataset bundle)`` for ``command``; ConfigError for checkpoints of another
    kind than modeconn's or of two architectures, and when no dataset is named or recorded."""
    from ..experiments.checkpoints import load_same_architecture

    ckpts = open_checkpoints([a, b])
    if ckpts[0].kind.name != "modeconn":
        raise ConfigError(f"{command} evaluates modeconn checkpoints (models with a dataset); {ckpts[0].describe()} "
                          "is not one")
    (ma, mb), (cfg, _) = load_same_architecture([a, b])
    return ma, mb, cfg, dataset_for(cfg, dataset, data, limit_train)
