"""Assignment margins, swap costs and the identity-vs-optimal proxy (docs/methods.md §1).

For a cost matrix ``C[i, j] = c_i(a_j)`` (neuron ``i`` realising feature ``j``, see
:func:`~modeconn.identifiability.realization_cost`) the identity is the unique cheapest assignment of features
to neurons when every reassignment ``π ≠ id`` has ``Δ_π = Σ_i C[i, π(i)] − Σ_i C[i, i] > 0``; the margin between
the best and second-best assignment measures how strongly the permutation symmetry is broken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from ..match.lap import solve_lap
from ._validate import check_perm, check_square


@dataclass(frozen=True)
class AssignmentMargin:
    """Best and second-best assignments of a cost matrix (minimisation).

    Attributes:
        perm: ``(n,)`` int64 — an optimal assignment, row ``i`` gets column ``perm[i]``.
        cost: ``Σ_i C[i, perm[i]]`` (``+inf`` if no assignment avoids every ``+inf`` entry).
        second_perm: ``(n,)`` int64, a best assignment different from ``perm``; ``None`` when ``n = 1``.
        second_cost: its cost (``+inf`` when ``n = 1`` or when every other assignment uses an ``+inf`` entry).
        margin: ``second_cost − cost ≥ 0``; 0 when the optimum is not unique (ties); ``+inf`` when ``n = 1`` or
            only one assignment is finite; ``0`` by convention when ``cost`` is ``+inf`` (all assignments are
            equally infeasible, nothing is identified).
    """

    perm: torch.Tensor
    cost: float
    second_perm: torch.Tensor | None
    second_cost: float
    margin: float


def _solve_min(c: np.ndarray) -> np.ndarray:
    rows, cols = linear_sum_assignment(c)
    perm = np.empty(c.shape[0], dtype=np.int64)
    perm[rows] = cols
    return perm


def _assignment_cost(c: np.ndarray, perm: np.ndarray) -> float:
    return float(c[np.arange(c.shape[0]), perm].sum())


def assignment_margin(C: Any) -> AssignmentMargin:
    """Exact best and second-best assignment of the ``(n, n)`` cost matrix ``C`` (minimising ``Σ_i C[i, π(i)]``).

    The best assignment ``π*`` comes from one LAP (``scipy.optimize.linear_sum_assignment``). Every other
    permutation differs from ``π*`` in at least one edge ``(i, π*(i))``, so the second best is the minimum over
    ``i`` of the best assignment with that one edge forbidden (the first level of Murty's / Lawler's ranking
    scheme): ``n`` more LAPs, exact. Ties give ``margin = 0``.

    ``+inf`` entries mean "not allowed". Internally ``C`` is divided by a power of two ``≥ max|finite C|`` (exact)
    and ``+inf`` entries are replaced by the finite penalty ``2n + 1`` (so any assignment avoiding them is preferred),
    and forbidden edges by a larger one
    still (so the second-best subproblem never returns ``π*``); the reported costs are always recomputed from the
    original ``C``.

    Args:
        C: ``(n, n)`` real costs, ``n ≥ 1``; ``+inf`` allowed.
    Returns:
        :class:`AssignmentMargin` (costs as Python floats).
    Raises:
        ConfigError: ``C`` not a non-empty square matrix.
        NonFiniteError: NaN or ``−inf`` in ``C``.
    """
    c = check_square(C, "C", allow_posinf=True).cpu().numpy()
    n = c.shape[0]
    finite = np.isfinite(c)
    scale = float(np.abs(c[finite]).max()) if finite.any() else 0.0
    # divide by a power of two ≥ max|finite C| (exact, so ties and order are kept): finite entries in [−1, 1]
    exponent = math.frexp(scale)[1] if scale > 0 else 0      # scale < 2**exponent
    big = 2.0 * n + 1.0                  # any assignment with a big entry loses to every all-finite one
    forbid = 2.0 * n * big + 1.0         # ... and any with a forbidden edge loses to every other one
    work = np.where(finite, np.ldexp(np.where(finite, c, 0.0), -exponent), big)
    perm = _solve_min(work)
    cost = _assignment_cost(c, perm)
    if n == 1:
        return AssignmentMargin(torch.from_numpy(perm), cost, None, math.inf, math.inf)
    best_perm, best_cost = None, math.inf
    for i in range(n):
        sub = work.copy()
        sub[i, perm[i]] = forbid
        cand = _solve_min(sub)
        cand_cost = _assignment_cost(c, cand)
        if best_perm is None or cand_cost < best_cost:
            best_perm, best_cost = cand, cand_cost
    assert best_perm is not None and not np.array_equal(best_perm, perm)
    if math.isinf(cost):
        margin = 0.0
    else:
        margin = max(best_cost - cost, 0.0)  # clamp round-off of differently ordered sums
    return AssignmentMargin(torch.from_numpy(perm), cost, torch.from_numpy(best_perm), best_cost, margin)


def swap_costs(C: Any, perm: Any = None) -> torch.Tensor:
    """Cost change of every transposition of an assignment: the pairwise swap cost (docs/methods.md §1).

    ``Δ[i, j] = C[i, perm[j]] + C[j, perm[i]] − C[i, perm[i]] − C[j, perm[j]]`` — what swapping the columns
    assigned to rows ``i`` and ``j`` adds to ``Σ_i C[i, perm[i]]``; symmetric, diagonal 0. With the default
    ``perm = identity`` and ``C`` from :func:`realization_cost` this is the cost of exchanging the features of
    neurons ``i`` and ``j``. ``Δ ≥ 0`` everywhere is necessary (not sufficient) for ``perm`` to be optimal.

    Args:
        C: ``(n, n)`` costs; ``+inf`` allowed.
        perm: ``(n,)`` permutation of ``range(n)``; default identity.
    Returns:
        ``(n, n)`` float64 (on ``C``'s device). An entry is ``+inf`` when the swap uses an infinite entry and the
        current pair is finite, and NaN when ``C[i, perm[i]]`` or ``C[j, perm[j]]`` is itself infinite (the
        difference is undefined).
    Raises:
        ConfigError: ``C`` not square, ``perm`` not a permutation of matching length.
        NonFiniteError: NaN or ``−inf`` in ``C``.
    """
    c = check_square(C, "C", allow_posinf=True)
    n = c.shape[0]
    p = torch.arange(n) if perm is None else check_perm(perm, n)
    cp = c[:, p.to(c.device)]                 # cp[i, j] = C[i, perm[j]]
    cur = torch.diagonal(cp)                  # C[i, perm[i]]
    delta = (cp + cp.mT) - (cur[:, None] + cur[None, :])  # exactly symmetric (IEEE + commutes)
    delta.fill_diagonal_(0.0)
    return delta


def permutation_sensitivity(C: Any, perm: Any) -> float:
    """Permutation sensitivity ``Δ_π = Σ_i C[i, π(i)] − Σ_i C[i, i]`` (docs/methods.md §1).

    Positive: reassigning the features by ``π`` costs more than the identity. Units of ``C``.

    Args:
        C: ``(n, n)`` costs; ``+inf`` allowed.
        perm: ``(n,)`` permutation ``π`` of ``range(n)``.
    Returns:
        Python float; ``+inf`` if only ``π`` uses an infinite entry, ``−inf`` if only the identity does, NaN if
        both do.
    Raises:
        ConfigError: ``C`` not square, ``perm`` not a permutation of matching length.
        NonFiniteError: NaN or ``−inf`` in ``C``.
    """
    c = check_square(C, "C", allow_posinf=True)
    n = c.shape[0]
    p = check_perm(perm, n).to(c.device)
    idx = torch.arange(n, device=c.device)
    return float(c[idx, p].sum()) - float(torch.diagonal(c).sum())


def identity_vs_optimal(corr: Any) -> dict[str, Any]:
    """Identifiability proxy: activation-matching objective of the identity vs the optimal permutation.

    With ``corr[i, j]`` the correlation of unit ``i`` of model A with unit ``j`` of model B at one space,
    ``identity = Σ_i corr[i, i]`` and ``optimal = max_π Σ_i corr[i, π(i)]`` (LAP via
    :func:`modeconn.match.lap.solve_lap`; ``optimal ≥ identity`` is enforced against round-off).
    ``ratio = identity / optimal`` when ``optimal > 0`` (``≤ 1``; → 1 means the identity is already the best
    alignment, i.e. the unaligned runs are identified). When ``optimal ≤ 0`` a quotient is meaningless: then
    ``ratio = 1.0`` if the identity attains the optimum and NaN otherwise; ``gap`` is always defined.

    Args:
        corr: ``(n, n)`` finite similarities (e.g. Pearson correlations).
    Returns:
        dict with ``identity``, ``optimal``, ``ratio``, ``gap = optimal − identity ≥ 0`` (Python floats) and ``perm``
        (``(n,)`` int64 optimal permutation).
    Raises:
        ConfigError: ``corr`` not a non-empty square matrix.
        NonFiniteError: NaN/Inf in ``corr``.
    """
    c = check_square(corr, "corr", allow_posinf=False)
    n = c.shape[0]
    perm = solve_lap(c, "corr")
    identity = float(torch.diagonal(c).sum())
    optimal = max(float(c[torch.arange(n, device=c.device), perm.to(c.device)].sum()), identity)
    if optimal > 0:
        ratio = identity / optimal
    else:
        ratio = 1.0 if identity >= optimal else float("nan")
    return {"identity": identity, "optimal": optimal, "ratio": ratio, "gap": optimal - identity, "perm": perm}
