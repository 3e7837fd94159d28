"""Reference weight matching: plain git-re-basin (Ainsworth et al. 2023, Alg. 1), permutations only.

A short, readable statement of the algorithm the engine in :mod:`modeconn.match.weight` implements (tests compare
the two on permutation-only specs). Maximise ``J(π) = Σ_k ⟨θ_A[k], (π·θ_B)[k]⟩``: visit the spaces in a random order
and, with every other permutation fixed, replace ``π_s`` by the LAP solution of the score ``S = Σ_{(k, axis) on s}
A_k B̃_kᵀ`` (``B̃_k``: B's tensor with the other spaces' permutations applied, both with ``axis`` first and the rest
flattened) when it raises ``J``; stop after a sweep that changes nothing. One run from the identity, no restarts,
no greedy start, no continuous groups, no streaming.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from scipy.optimize import linear_sum_assignment

from ..config import StrictConfig
from ..errors import ConfigError
from ..symmetry import SymmetrySpec
from .options import Int, PositiveInt
from .result import Alignment
from .weight import scored_keys, unit_matrix


class ReferenceMatchingConfig(StrictConfig):
    """Options of :func:`reference_weight_matching`: ``max_iter`` sweeps at most (≥ 1); ``seed`` of the orders."""

    max_iter: PositiveInt = 100
    seed: Int = 0


def reference_weight_matching(spec: SymmetrySpec, sd_a: Mapping[str, torch.Tensor], sd_b: Mapping[str, torch.Tensor],
                              config: ReferenceMatchingConfig | Mapping[str, Any] | None = None,
                              **options: Any) -> Alignment:
    """Align ``sd_b`` to ``sd_a`` by plain permutation weight matching (module docstring). Same orders as
    ``weight_matching(spec, sd_a, sd_b, restarts=1, init="identity", rtol=0, seed=seed)``.

    Returns: :class:`Alignment` (method ``"reference"``, ``objective`` J, ``history`` [J per sweep]).
    Raises: ConfigError for a space of another group than ``permutation`` or a bad option.
    """
    cfg = ReferenceMatchingConfig.from_any(config, **options)
    if any(not spec.group_of(s).exact for s in spec.spaces):
        raise ConfigError("reference weight matching solves permutation spaces only; use weight_matching")
    keys = scored_keys(spec, sd_a)
    a = {k: sd_a[k].detach().double() for k in keys}
    b = {k: sd_b[k].detach().double() for k in keys}
    perm, spaces, gen = spec.identity(), list(spec.spaces), torch.Generator().manual_seed(cfg.seed)

    def objective() -> float:
        return sum(float((a[k] * spec.apply_tensor(k, b[k], perm)).sum()) for k in keys)

    history = [objective()]
    for _ in range(cfg.max_iter):
        changed = False
        for i in torch.randperm(len(spaces), generator=gen).tolist():
            s, n = spaces[i], spec.spaces[spaces[i]].size
            score = torch.zeros(n, n, dtype=torch.float64)
            for k, bd in spec.bindings_by_space[s]:
                if k in a:  # A's units against B's units, every other space of the tensor permuted already
                    score += unit_matrix(a[k], bd, n) @ unit_matrix(spec.apply_tensor(k, b[k], perm, skip=bd), bd, n).T
            _, new = linear_sum_assignment(score.numpy(), maximize=True)
            new, idx = torch.from_numpy(new), torch.arange(n)
            if score[idx, new].sum() > score[idx, perm[s]].sum():
                perm[s], changed = new, True
        history.append(objective())
        if not changed:
            break
    return Alignment("reference", spec, perm, history[-1], [history], {"iterations": len(history) - 1})
