"""An endless, seeded, resumable stream of training minibatches (shared by LLPF and curve training).

Path searches draw many minibatches and must be reproducible bit for bit across a kill/resume, so they do
not iterate a caller's DataLoader (whose shuffling state cannot be saved): they read its *dataset* and draw
batches from a permutation made with the run's own ``torch.Generator``. Each epoch is a fresh
``torch.randperm(n, generator=g)``; batches are full (an incomplete tail is dropped, as with
``drop_last=True``, so BatchNorm never sees a tiny batch), except when the dataset is smaller than one batch
(then every batch is the whole dataset, in permuted order).

The digests a resumable search depends on: :func:`~modeconn._util.digest.tensors_sha256` (a state dict's content)
and :func:`data_fingerprint` (the training data a search draws its batches from).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.dataloader import default_collate

from .._util.digest import update_named_tensor
from ..errors import ConfigError

DEFAULT_BATCH_SIZE = 128


def resolve_dataset(data: Any, batch_size: int | None) -> tuple[Dataset, int]:
    """``(dataset, batch_size)`` from a Dataset or a DataLoader (its ``.dataset`` and ``.batch_size``;
    its sampler/shuffling is ignored). Raises ConfigError for anything else or a bad batch size."""
    if isinstance(data, DataLoader):
        ds = data.dataset
        bs = batch_size if batch_size is not None else (data.batch_size or DEFAULT_BATCH_SIZE)
    elif isinstance(data, Dataset) or (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        ds, bs = data, batch_size if batch_size is not None else DEFAULT_BATCH_SIZE
    else:
        raise ConfigError(
            f"training data must be a torch Dataset (e.g. TensorDataset) or a DataLoader, got {type(data).__name__}"
        )
    if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {bs!r}")
    if len(ds) == 0:
        raise ConfigError("training data is empty")
    return ds, bs


class BatchStream:
    """Endless minibatches ``(x, y)`` of ``dataset`` in epochs of a permutation drawn from ``generator``.

    ``state_dict()`` / ``load_state_dict()`` capture the position (the current permutation and the offset);
    the generator's own state is saved by the owner (it is shared with other random choices of the run).
    """

    def __init__(self, dataset: Dataset, batch_size: int, generator: torch.Generator) -> None:
        self.dataset = dataset
        self.n = len(dataset)
        self.batch_size = min(batch_size, self.n)
        self.generator = generator
        self.perm = torch.empty(0, dtype=torch.int64)
        self.pos = 0
        self.epoch = 0

    def next(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
        if self.pos + self.batch_size > len(self.perm):
            self.perm = torch.randperm(self.n, generator=self.generator)
            self.pos = 0
            self.epoch += 1
        idx = self.perm[self.pos:self.pos + self.batch_size]
        self.pos += self.batch_size
        if isinstance(self.dataset, TensorDataset):
            batch = tuple(t[idx] for t in self.dataset.tensors)
        else:
            batch = default_collate([self.dataset[int(i)] for i in idx])
        return tuple(b.to(device) if isinstance(b, torch.Tensor) else b for b in batch)

    def state_dict(self) -> dict[str, Any]:
        return {"perm": self.perm.clone(), "pos": self.pos, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.perm = state["perm"].to(torch.int64).clone()
        self.pos = int(state["pos"])
        self.epoch = int(state["epoch"])


# ------------------------------------------------------------------------------------------ digests


def dataset_sha256(dataset: Dataset) -> str:
    """sha256 of every example of ``dataset`` — the data every minibatch of a search is drawn from. A
    ``TensorDataset`` is hashed through its tensors (one pass over their bytes); any other dataset item by
    item (its tensors, or the ``repr`` of non-tensor fields)."""
    h = hashlib.sha256()
    h.update(f"n={len(dataset)}".encode())
    if isinstance(dataset, TensorDataset):
        for j, t in enumerate(dataset.tensors):
            update_named_tensor(h, str(j), t)
        return h.hexdigest()
    for i in range(len(dataset)):
        item = dataset[i]
        for j, field in enumerate(item if isinstance(item, (tuple, list)) else (item,)):
            if isinstance(field, torch.Tensor):
                update_named_tensor(h, f"{i}.{j}", field)
            else:
                h.update(f"{i}.{j}={field!r}".encode())
    return h.hexdigest()


def data_fingerprint(dataset: Dataset, info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What identifies a search's training data: ``info`` (e.g. ``{"name": "mnist", "split": "train",
    "limit": 2000}``, as the caller knows it) plus the number of examples and :func:`dataset_sha256` (every
    batch the search draws comes from these examples, in an order fixed by the run's seed)."""
    return {**dict(info or {}), "examples": len(dataset), "sha256": dataset_sha256(dataset)}
