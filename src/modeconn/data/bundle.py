"""The dataset bundle, the seeded train/validation split and deterministic data loaders."""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from ..errors import ConfigError


@dataclass(frozen=True)
class DatasetBundle:
    """Train / validation / test splits of one dataset as in-memory tensors.

    Every split is a ``TensorDataset(x, y)`` with ``x`` float32 of shape ``(N, C, H, W)``, normalised per
    channel as ``(pixel / scale - mean) / std`` (constants in :data:`modeconn.data.datasets.DATASETS`), and
    ``y`` int64 class indices in ``[0, num_classes)``.

    Attributes:
        name: registry name ("digits", "mnist", ...).
        train: the official training set minus the validation split (optionally truncated).
        val: a fixed seeded split of the official training set; empty if ``val_fraction == 0``.
        test: the official test set (for "digits" a fixed stratified 20 % split); optionally truncated.
        num_classes: number of classes.
        input_shape: ``(C, H, W)``.
        classes: human-readable class names, index = label.
        source: directory the files were read from, or ``"sklearn"``.
    """

    name: str
    train: TensorDataset
    val: TensorDataset
    test: TensorDataset
    num_classes: int
    input_shape: tuple[int, ...]
    classes: tuple[str, ...]
    source: str


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of ``range(n)`` into (train, val) index arrays, each sorted ascending (int64).

    ``round(n * val_fraction)`` indices go to validation, chosen by ``numpy.random.default_rng(seed)``; the
    same ``(n, val_fraction, seed)`` gives the same indices in every process.

    Raises:
        ConfigError: ``val_fraction`` outside ``[0, 1)``.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
    perm = np.random.default_rng(seed).permutation(n)
    n_val = int(round(n * val_fraction))
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def normalize(images: np.ndarray, scale: float, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``(images / scale - mean) / std`` per channel as float32; ``images`` is ``(N, C, H, W)``."""
    x = torch.from_numpy(np.ascontiguousarray(images)).to(torch.float32, copy=True)  # never alias input
    shape = (1, len(mean), 1, 1)
    m = torch.tensor(mean, dtype=torch.float32).view(shape)
    s = torch.tensor(std, dtype=torch.float32).view(shape)
    return x.div_(scale).sub_(m).div_(s)


def tensor_dataset(x: torch.Tensor, y: np.ndarray | torch.Tensor) -> TensorDataset:
    """``TensorDataset(x, y)`` with ``y`` converted to an int64 tensor (copied, never aliased)."""
    return TensorDataset(x, torch.tensor(np.asarray(y), dtype=torch.int64))


def make_loader(
    dataset: Dataset, batch_size: int, *, shuffle: bool = False, seed: int = 0, drop_last: bool = False
) -> DataLoader:
    """A deterministic single-process DataLoader over ``dataset``.

    With ``shuffle=True`` the order comes from ``torch.Generator().manual_seed(seed)``, owned by the loader:
    two loaders built with the same seed yield the same batches epoch after epoch, and the global RNG is
    neither read nor advanced (also with ``shuffle=False``). ``num_workers=0``.

    Raises:
        ConfigError: ``batch_size`` is not a positive integer.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    # Always pass a generator: even without shuffling, iteration draws a base seed, which would otherwise
    # come from (and advance) the global RNG.
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator,
                      num_workers=0, drop_last=drop_last)
