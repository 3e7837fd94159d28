"""A lazy checkpoint whose split tensors read as the model's banks (transformers 5's Mixture-of-Experts layout).

transformers 5 holds a layer's experts as stacked banks (``mlp.experts.gate_up_proj``, (E, 2I, d)) but stores them
per expert (Mixtral's ``block_sparse_moe.experts.{e}.w1`` / ``w3`` …) and converts on loading. :class:`Stacked`
presents a stored checkpoint with each bank in place of its parts (:func:`modeconn.io.hf.checkpoint_layout`), so
that the symmetry spec, streaming weight matching and the streamed writers work on the banks the spec binds; a
written copy keeps the banks, under the model's names, which ``from_pretrained`` loads as they are.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import CheckpointError
from .hf import Stacking
from .lazy import LazyCheckpoint, TensorInfo


class Stacked(LazyCheckpoint):
    """``ckpt`` with every bank of ``stacked`` (model key → :class:`~modeconn.io.hf.Stacking`) in place of its parts:
    listed where its first part is (same shard), read by concatenating the parts' rows. ``source`` is the stored
    checkpoint. Banks whose parts the checkpoint does not hold (a checkpoint written with banks) are left as stored.
    CheckpointError naming the checkpoint and bank when the parts' shapes or dtypes do not fit the bank."""

    def __init__(self, ckpt: LazyCheckpoint, stacked: Mapping[str, Stacking]) -> None:  # noqa: D107
        self.__dict__.update(ckpt.__dict__)
        self.source = ckpt
        self.stacked = {k: st for k, st in stacked.items() if all(p.key in ckpt.infos for p in st.parts)}
        first = {st.parts[0].key: k for k, st in self.stacked.items()}
        hidden = {p.key for st in self.stacked.values() for p in st.parts}
        infos: dict[str, TensorInfo] = {}
        for key, info in ckpt.infos.items():
            if key in first:
                bank = first[key]
                infos[bank] = TensorInfo(bank, info.shard, self._dtype(bank), self.stacked[bank].shape)
            elif key not in hidden:
                infos[key] = info
        self.infos = infos
        self.shards = {s: tuple(k for k, i in infos.items() if i.shard == s) for s in ckpt.shards}
        self._finite = set()
        if self.index is not None:
            self.index = {**self.index, "weight_map": {k: i.shard for k, i in infos.items()}}

    def _dtype(self, bank: str) -> torch.dtype:
        parts = self.stacked[bank].parts
        infos = [self.source.infos[p.key] for p in parts]
        if any(i.shape != p.shape for i, p in zip(infos, parts, strict=True)) or len({i.dtype for i in infos}) != 1:
            raise CheckpointError(f"{self.source.path}: the stored parts of {bank!r} ({parts[0].key!r} …) do not have the "
                                  "shapes and the one dtype the model's conversion expects")
        return infos[0].dtype

    def _assemble(self, key: str, read) -> torch.Tensor:
        st = self.stacked.get(key)
        if st is None:
            return read(key)
        return torch.cat([read(p.key).reshape(p.rows, -1) for p in st.parts]).reshape(st.shape)

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._assemble(key, self.source.__getitem__)

    def read(self, key: str) -> torch.Tensor:
        return self._assemble(key, self.source.read)

    def read_rows(self, key: str, start: int, count: int) -> torch.Tensor:
        if key not in self.stacked:
            return self.source.read_rows(key, start, count)
        shape = self.infos[key].shape
        if start < 0 or count < 0 or start + count > shape[0]:
            raise ValueError(f"rows {start}:{start + count} of tensor {key!r} of shape {shape}")
        return self.read(key)[start:start + count].clone()

    def read_rows_at(self, key: str, rows: torch.Tensor) -> torch.Tensor:
        if key not in self.stacked:
            return self.source.read_rows_at(key, rows)
        shape = self.infos[key].shape
        if any(not 0 <= r < shape[0] for r in rows.tolist()):
            raise ValueError(f"rows outside tensor {key!r} of shape {shape}")
        return self.read(key).index_select(0, rows.long())

    def __repr__(self) -> str:
        return f"Stacked({self.source!r}, {len(self.stacked)} banks)"


def stacked_view(ckpt: LazyCheckpoint, stacked: Mapping[str, Stacking]) -> LazyCheckpoint:
    """``ckpt`` as :class:`Stacked` where it stores parts of ``stacked``'s banks, else itself."""
    if isinstance(ckpt, Stacked) or not stacked:
        return ckpt
    view = Stacked(ckpt, stacked)
    return view if view.stacked else ckpt
