"""A lazy checkpoint seen in another vocabulary: its token-indexed tensors' rows gathered into a new token numbering.

    view = RowGathered(LazyCheckpoint("ckpt/b"), keys=["model.embed_tokens.weight", "lm_head.weight"],
                       rows=torch.tensor([0, 2, -1, 1]), total=8)
    view["lm_head.weight"]          # (8, hidden): rows 0, 2, 1 of B's at new ids 0, 1, 3; zeros elsewhere

The view is a :class:`~modeconn.io.lazy.LazyCheckpoint` (headers, layout, reads) whose ``keys`` have ``total`` rows
along their first axis (the token axis of Hugging Face embeddings and LM heads); new id ``i`` holds the stored row
``rows[i]``, and a row with no source (``-1``, or past ``len(rows)``: padding) reads as zeros. Every other tensor is
read as stored. Merges across vocabularies check shapes, align and merge on such views (what fills the zero rows is
the merge's business, :mod:`modeconn.recipes.merge_vocab`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch

from .lazy import LazyCheckpoint


class RowGathered(LazyCheckpoint):
    """``ckpt`` with the tensors ``keys`` (those it stores) gathered to ``total`` rows by ``rows`` (new id → stored
    row or -1; at most ``total`` entries). ``source`` is the stored checkpoint. Raises ValueError for a row index out
    of a tensor's range (when the tensor is read) or more ``rows`` than ``total``."""

    def __init__(self, ckpt: LazyCheckpoint, keys: Iterable[str], rows: torch.Tensor, total: int) -> None:  # noqa: D107
        if len(rows) > total:
            raise ValueError(f"{len(rows)} rows gathered into a vocabulary of {total}")
        self.__dict__.update(ckpt.__dict__)
        self.source, self.rows, self.total = ckpt, rows.long(), total
        self.gathered = frozenset(k for k in keys if k in ckpt)
        self.infos = {k: dataclasses.replace(i, shape=(total, *i.shape[1:])) if k in self.gathered else i
                      for k, i in ckpt.infos.items()}
        if self.index is not None:
            meta = {**self.index.get("metadata", {}), "total_size": sum(i.nbytes for i in self.infos.values())}
            self.index = {**self.index, "metadata": meta}

    def _gather(self, key: str, t: torch.Tensor) -> torch.Tensor:
        if key not in self.gathered:
            return t
        have = self.rows >= 0
        if bool(have.any()) and int(self.rows.max()) >= t.shape[0]:
            raise ValueError(f"{self.source.path}: tensor {key!r} has {t.shape[0]} rows, row {int(self.rows.max())} "
                             "is gathered")
        out = t.new_zeros((self.total, *t.shape[1:]))
        out[: len(self.rows)][have] = t[self.rows[have]]
        return out

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._gather(key, self.source[key])

    def read(self, key: str) -> torch.Tensor:
        return self._gather(key, self.source.read(key))

    def read_rows(self, key: str, start: int, count: int) -> torch.Tensor:
        if key not in self.gathered:
            return self.source.read_rows(key, start, count)
        if start < 0 or count < 0 or start + count > self.total:
            raise ValueError(f"rows {start}:{start + count} of tensor {key!r} of shape {self.infos[key].shape}")
        return self.read(key)[start:start + count].clone()

    def __repr__(self) -> str:
        return f"RowGathered({self.source!r}, {sorted(self.gathered)}, {self.total} rows)"
