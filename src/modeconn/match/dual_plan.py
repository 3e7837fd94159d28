"""Dual matching's work on the continuous spaces (:mod:`modeconn.match.dual`): which tensors they touch and how an
element acts on them differentiably, whole or on one rank's row block (sharded runs)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

import torch

from ..symmetry import Element, SymmetrySpec
from ..symmetry.spec import _act_on_binding  # one binding's action: the spec's own code, on a block
from .sharded import row_block, unit_range

StateDict = Mapping[str, torch.Tensor]


class _ContinuousPlan:
    """Which tensors the continuous spaces touch, and how to act on them differentiably: the spec's own
    ``apply_tensor`` with every discrete binding skipped (those are applied once, up front), tied aliases
    (``SymmetrySpec.aliases``) sharing their primary's result."""

    def __init__(self, spec: SymmetrySpec, continuous: list[str], sd: StateDict) -> None:
        self.spec = spec
        cont = set(continuous)
        self.skips: dict[str, tuple] = {}
        for key, binds in spec.tensors.items():
            if key in sd and any(b.space in cont for b in binds):
                self.skips[key] = tuple(b for b in binds if b.space not in cont)
        self.aliases = spec.aliases_in(sd)
        self.ndim = {k: max(t.dim(), 1) for k, t in sd.items()}

    def bindings(self, key: str) -> tuple:
        """The continuous bindings of tensor ``key`` (empty: no continuous space acts on it)."""
        skips = self.skips.get(key)
        return () if skips is None else tuple(b for b in self.spec.tensors[key] if not any(b is x for x in skips))

    def block_axis(self, key: str, shape: tuple[int, ...], world: int) -> int | None:
        """The axis of tensor ``key`` (``shape``) along which every rank's :func:`~.sharded.row_block` of ``world``
        transforms on its own: the first axis no continuous binding acts on, else the first whose continuous bindings
        are unit-wise groups (one element entry per unit: the per-head maps) with whole units in every block (e.g. a
        fused QKV projection's rows split at head boundaries: each block needs its heads' matrices only). None: every
        axis couples the blocks (a scalar, or e.g. a residual-only vector)."""
        def splits(axis: int) -> bool:
            blocks = [row_block(shape[axis], r, world) for r in range(world)]
            return all(self.spec.group_of(b.space).unitwise and all(
                unit_range(b, self.spec.spaces[b.space].size, *blk) is not None for blk in blocks)
                for b in self.bindings(key) if b.axis % len(shape) == axis)

        ok = [a for a in range(len(shape)) if splits(a)]
        return min(ok, key=lambda a: (any(b.axis % len(shape) == a for b in self.bindings(key)), a), default=None)

    def held_units(self, blocks: Mapping[str, tuple[int, int, int]], keys: Iterable[str]) -> dict[str, tuple[int, int]]:
        """Per unit-wise continuous space, the units ``[lo, hi)`` of its element that this rank's tensors read: for a
        tensor of ``blocks`` (key → ``(axis, start, stop)`` of this rank's block) bound along its block axis the
        block's units, for the other ``keys`` all units. Spaces none of them reads are left out (whole)."""
        held: dict[str, tuple[int, int]] = {}
        for key in keys:
            axis, start, stop = blocks.get(key, (None, 0, 0))
            for b in self.bindings(key):
                if not self.spec.group_of(b.space).unitwise:
                    continue
                n = self.spec.spaces[b.space].size
                u0, u1 = unit_range(b, n, start, stop) if b.axis % self.ndim[key] == axis else (0, n)
                if u0 < u1:
                    lo, hi = held.get(b.space, (u0, u1))
                    held[b.space] = (min(lo, u0), max(hi, u1))
        return held

    def act_block(self, key: str, t: torch.Tensor, g: Element | None, block: tuple[int, int, int],
                  held: Mapping[str, tuple[int, int]]) -> torch.Tensor:
        """``g`` acting on this rank's block ``t`` of tensor ``key`` (``block``: ``(axis, start, stop)`` from
        :meth:`block_axis`): bindings of other axes act whole; those of the block axis with the block's units of their
        elements (``g``'s unit-wise spaces hold the units ``held``, :meth:`held_units`)."""
        if g is None or not t.numel():
            return t
        axis, start, stop = block
        for b in self.bindings(key):
            group, n = self.spec.group_of(b.space), self.spec.spaces[b.space].size
            if b.axis % self.ndim[key] != axis:
                t = _act_on_binding(t, b, g[b.space], n, group)
                continue
            u0, u1 = unit_range(b, n, start, stop)
            if u0 < u1:
                lo = held.get(b.space, (0, n))[0]
                local = replace(b, offset=b.offset + u0 * b.step - start, partial=True)
                t = _act_on_binding(t, local, g[b.space][u0 - lo:u1 - lo], u1 - u0, group)
        return t

    def act_key(self, key: str, t: torch.Tensor, g: Element | None, cache: dict | None = None) -> torch.Tensor:
        """``g`` (continuous spaces only; None: the identity) acting on tensor ``key``'s value ``t``."""
        skip = self.skips.get(key)
        return t if skip is None or g is None else self.spec.apply_tensor(key, t, g, skip=skip, cache=cache)

    def act(self, sd: StateDict, g: Element | None) -> dict[str, torch.Tensor]:
        cache: dict = {}
        out = {key: self.act_key(key, t, g, cache) for key, t in sd.items() if key not in self.aliases}
        for alias, primary in self.aliases.items():
            out[alias] = out[primary]
        return {k: out[k] for k in sd}
