"""The score terms of in-memory weight matching, kept between LAP steps and updated by low rank.

The LAP score of a permutation space ``s`` is a sum of terms, one per binding ``bd`` of a tensor ``k`` to ``s``::

    T_k = unit(A_k) · unit(g·B_k)ᵀ            (n, n);  unit(·): one row per unit of s (:func:`unit_matrix`)

where ``g`` acts on every binding of ``k`` except ``bd`` (Ainsworth et al. 2023, eq. 3 summed over tensors). A term
depends only on the elements of ``k``'s other bindings, so it is kept while they are the same objects (elements are
replaced, never changed in place) within a memory budget.

When those elements did change, but only along one axis ``o`` and only at positions ``P`` (a neighbouring permutation
moved ``|P|`` of its units — late sweeps move a few), the term changes by a rank-``|P|·r`` product (``r`` the entries
of a slice along ``o``; ``(g·B)[…, p, …] = B[…, idx(p), …]`` along ``o`` for the gather index ``idx`` of
:meth:`SymmetrySpec.permutation_gathers`)::

    T_new = T_old + unit(A[…, P, …]) · (unit(B[…, idx_new(P), …]) − unit(B[…, idx_old(P), …]))ᵀ

which costs ``|P| / len(o)`` of recomputing it. Updated terms differ from recomputed ones by fp32 rounding only; a term
is recomputed in full after :data:`MAX_UPDATES` updates in a row (rounding does not accumulate without bound) and
whenever half or more of the axis moved (then recomputing is as cheap).

A kept term also holds its tensor's share of the objective, ``⟨A_k, (g·B)_k⟩ = Σ_i T_k[i, g_s(i)]``
(:meth:`ScoreTerms.contribution`), so the objective needs no pass that forms ``g·B``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..symmetry import AxisBinding, Element, SymmetrySpec
from ..symmetry.spec import apply_gathers

MAX_UPDATES = 16
"""Low-rank updates of one term before it is recomputed in full."""
BUDGET_BYTES = 256 << 20
"""Memory for the kept terms."""


def unit_matrix(t: torch.Tensor, b: AxisBinding, n: int) -> torch.Tensor:
    """The (n, -1) matrix of ``t`` with one row per unit of ``b``'s space (block entries kept together;
    row ``i`` is the unit's ``block`` entries along the axis, each followed by the rest of the tensor)."""
    if b.unit_axis is not None:  # units along another axis: unit i is its index there, then its block of ``axis``
        return restrict(t, b, n).movedim((b.unit_axis, b.axis), (0, 1)).reshape(n, -1)
    return restrict(t, b, n).movedim(b.axis, 0).reshape(n, -1)


def assignment_score(score: torch.Tensor, perm: torch.Tensor) -> float:
    """``Σ_i score[i, perm[i]]`` (fp64 sum) of an (n, n) score and a permutation of ``n``."""
    perm = perm.to(score.device)
    return float(score[torch.arange(len(perm), device=score.device), perm].double().sum())


def restrict(t: torch.Tensor, b: AxisBinding, n: int) -> torch.Tensor:
    """``t`` restricted to the ``n`` units of ``b`` along ``b.axis``, unit by unit (a view for a contiguous binding)."""
    if b.unit_axis is not None:
        return t.narrow(b.axis, b.offset, b.block)
    if b.step != b.block:
        return t.index_select(b.axis, b.indices(n, t.device))
    return t.narrow(b.axis, b.offset, n * b.block)


@dataclass
class _Kept:
    elements: tuple[torch.Tensor, ...]  # of the tensor's other bindings, when the term was formed
    term: torch.Tensor
    gathers: dict[int, torch.Tensor] | None  # g on the other bindings as gathers (None: not all permutations)
    updates: int  # low-rank updates since the term was last computed in full


class ScoreTerms:
    """The terms ``T_k`` of in-memory weight matching for fixed fp32 tensors ``a``, ``b`` (module docstring).
    ``computed`` / ``updated`` / ``reused`` count the terms formed in full, by a low-rank update, and taken as kept."""

    def __init__(self, spec: SymmetrySpec, a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor],
                 budget: int = BUDGET_BYTES) -> None:
        self.spec, self.a, self.b, self.budget = spec, a, b, budget
        self.kept: dict[tuple[str, int], _Kept] = {}
        self.bytes = 0
        self.computed = self.updated = self.reused = 0

    def stats(self) -> dict[str, int]:
        return {"terms_computed": self.computed, "terms_updated": self.updated, "terms_reused": self.reused}

    def term(self, k: str, bd: AxisBinding, a_mat: torch.Tensor, g: Element, n: int) -> torch.Tensor:
        """``T_k`` (n, n) of tensor ``k`` on binding ``bd`` with every other binding at ``g``; ``a_mat`` is
        ``unit_matrix(a[k], bd, n)``."""
        key = (k, id(bd))
        elements = self._others(k, bd, g)
        kept = self.kept.get(key)
        if kept is not None and _same(kept.elements, elements):
            self.reused += 1
            return kept.term
        gathers = self.spec.permutation_gathers(k, self.b[k].shape, g, skip=bd, device=self.b[k].device)
        term = self._updated(k, bd, kept, gathers, n) if kept is not None and gathers is not None else None
        updates = kept.updates + 1 if term is not None else 0
        if term is None:
            term = a_mat @ unit_matrix(self.spec.apply_tensor(k, self.b[k], g, skip=bd), bd, n).T
            self.computed += 1
        else:
            self.updated += 1
        self._keep(key, _Kept(elements, term, gathers, updates))
        return term

    def contribution(self, k: str, g: Element) -> float | None:
        """``⟨A_k, (g·B)_k⟩`` read off a kept term, or None when no kept term gives it.

        For a binding ``bd`` on a permutation space that is alone on its axis and covers it, with the tensor's other
        elements those of ``g``: row ``i`` of ``unit(g·B)`` is row ``g_s(i)`` of ``unit(B with the other bindings
        applied)``, so ``⟨A_k, (g·B)_k⟩ = Σ_i T_k[i, g_s(i)]`` (fp64 sum of the fp32 term)."""
        binds = self.spec.tensors[k]
        shape = self.a[k].shape
        for bd in binds:
            kept = self.kept.get((k, id(bd)))
            space = self.spec.spaces[bd.space]
            if (kept is None or self.spec.group_of(bd.space).name != "permutation" or space.parent is not None
                    or self.spec.children[bd.space] or any(b is not bd and b.axis == bd.axis for b in binds)
                    or bd.offset != 0 or bd.step != bd.block or space.size * bd.block != shape[bd.axis]):
                continue
            if _same(kept.elements, self._others(k, bd, g)):
                return assignment_score(kept.term, g[bd.space])
        return None

    def _others(self, k: str, bd: AxisBinding, g: Element) -> tuple[torch.Tensor, ...]:
        """The elements of ``g`` on tensor ``k``'s bindings other than ``bd`` (what its term reads)."""
        return tuple(g[b.space] for b in self.spec.tensors[k] if b is not bd)

    def _updated(self, k: str, bd: AxisBinding, kept: _Kept, new: dict[int, torch.Tensor],
                 n: int) -> torch.Tensor | None:
        """The kept term moved to the gathers ``new`` by one low-rank update, or None when that is not possible or
        not cheaper (module docstring)."""
        old = kept.gathers
        if old is None or kept.updates >= MAX_UPDATES or old.keys() != new.keys():
            return None
        moved_axes = [ax for ax in new if not torch.equal(new[ax], old[ax])]
        if len(moved_axes) != 1 or moved_axes[0] == bd.axis:
            return None
        o = moved_axes[0]
        pos = (new[o] != old[o]).nonzero().squeeze(1)
        if 2 * pos.numel() >= new[o].numel():
            return None
        others = {ax: idx for ax, idx in new.items() if ax != o}
        a_sub = unit_matrix(self.a[k].index_select(o, pos), bd, n)
        b_new = unit_matrix(apply_gathers(self.b[k].index_select(o, new[o][pos]), others), bd, n)
        b_old = unit_matrix(apply_gathers(self.b[k].index_select(o, old[o][pos]), others), bd, n)
        return torch.addmm(kept.term, a_sub, (b_new - b_old).T)

    def _keep(self, key: tuple[str, int], entry: _Kept) -> None:
        """Keep ``entry`` in place of ``key``'s old one, within the budget (else drop both)."""
        old = self.kept.pop(key, None)
        if old is not None:
            self.bytes -= _nbytes(old.term)
        size = _nbytes(entry.term)
        if self.bytes + size <= self.budget:
            self.kept[key] = entry
            self.bytes += size


def _same(kept: tuple[torch.Tensor, ...], now: tuple[torch.Tensor, ...]) -> bool:
    """Whether two tuples of elements are the same objects (elements are replaced, never changed in place)."""
    return len(kept) == len(now) and all(x is y for x, y in zip(kept, now, strict=True))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
