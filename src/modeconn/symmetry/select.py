"""Unit selection: keep ``k`` of a space's ``n`` units (a gather with a length-``k`` index vector).

A permutation ``g`` reorders all ``n`` units of a space and keeps the function (:meth:`SymmetrySpec.apply`); a
*selection* ``s`` (distinct unit indices, ``len(s) = k ≤ n``) keeps only units ``s[0], …, s[k-1]``, in that order, on
every tensor axis bound to the space — the rows a layer writes and the columns the next layers read. The result is
a state dict of the same architecture at width ``k``; it computes the same function exactly when the dropped units
contribute nothing downstream (zero outgoing weights), and is otherwise the starting point of width fusion
(:func:`modeconn.path.width.merge_widths`; Singh & Jaggi 2020, Stoica et al. 2024).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import ConfigError
from .spec import AxisBinding, StateDict, SymmetrySpec

__all__ = ["check_selectable", "select_units"]

Selection = Mapping[str, torch.Tensor]


def check_selectable(spec: SymmetrySpec, spaces) -> None:
    """ConfigError naming the first of ``spaces`` whose width cannot change: not a permutation space, a space with
    child spaces (per-unit transforms), or bound with a stride (interleaved blocks such as fused attention heads)."""
    for s in spaces:
        if s not in spec.spaces:
            raise ConfigError(f"space {s!r} is not a space of the spec; spaces: {list(spec.spaces)}")
        sp = spec.spaces[s]
        if sp.group != "permutation" or sp.parent is not None or spec.children[s]:
            raise ConfigError(
                f"space {s!r} ({sp.group}{', with child spaces' if spec.children[s] else ''}) cannot change width: "
                "only a permutation space without child spaces can keep a subset of its units")
        strided = [k for k, b in spec.bindings_by_space[s] if b.step != b.block]
        if strided:
            raise ConfigError(f"space {s!r} cannot change width: tensor {strided[0]!r} interleaves its units with "
                              "another space's (a strided binding)")


def select_units(spec: SymmetrySpec, state_dict: StateDict, selection: Selection) -> dict[str, torch.Tensor]:
    """Keep the units ``selection[space]`` (LongTensor (k,), distinct indices in ``[0, n)``, in the order given) of
    every space named in ``selection``, on every tensor axis bound to it; other spaces keep all their units.

    Returns a new state dict (tensors no selected space touches are the same objects; inputs never mutated); an
    axis of length ``L`` bound to a space of ``n`` units with block ``b`` becomes ``L - (n - k)·b`` long.
    Raises: StateDictMismatchError (``state_dict`` does not fit ``spec``); ConfigError naming the space for an
    index vector that is not 1-D, has repeats or out-of-range entries, or a space whose width cannot change
    (:func:`check_selectable`).
    """
    spec.check_state_dict(state_dict)
    check_selectable(spec, selection)
    for s, idx in selection.items():
        _check_index(s, idx, spec.spaces[s].size)
    out = {}
    for key, t in state_dict.items():
        binds = [b for b in spec.tensors.get(key, ()) if b.space in selection]
        out[key] = t
        for axis in sorted({b.axis for b in binds}):
            index = _axis_index(spec, [b for b in binds if b.axis == axis], t.shape[axis], selection)
            out[key] = out[key].index_select(axis, index.to(t.device))
    return out


def _axis_index(spec: SymmetrySpec, binds: list[AxisBinding], length: int, selection: Selection) -> torch.Tensor:
    """The gather index of one axis: unbound stretches kept, each bound range replaced by its selected units."""
    pieces, pos = [], 0
    for b in sorted(binds, key=lambda b: b.offset):
        n = spec.spaces[b.space].size
        pieces.append(torch.arange(pos, b.offset))
        pieces.append(b.indices(n).reshape(n, b.block)[selection[b.space].cpu()].reshape(-1))
        pos = b.span(n)
    pieces.append(torch.arange(pos, length))
    return torch.cat(pieces)


def _check_index(space: str, idx: torch.Tensor, n: int) -> None:
    if not isinstance(idx, torch.Tensor) or idx.dim() != 1 or idx.dtype != torch.long:
        raise ConfigError(f"selection of space {space!r} must be a 1-D LongTensor of unit indices")
    if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise ConfigError(f"selection of space {space!r} has indices outside [0, {n})")
    if len(torch.unique(idx)) != len(idx):
        raise ConfigError(f"selection of space {space!r} repeats a unit")
