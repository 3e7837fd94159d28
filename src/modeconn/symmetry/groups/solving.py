"""Weight-matching solvers of one space: the interface a group's ``solver`` hook implements, and the closed forms
the groups share.

Weight matching (docs/methods.md §0; Ainsworth et al. 2023, "git re-basin") updates one space at a time with the
others fixed. For a space, every bound tensor axis ("term") contributes a pair of unit matrices: ``X`` from
θ_A and ``Y`` from θ_B with every other space already applied, each of shape ``(…, d, m)`` — ``d`` rows
per unit transform (``n`` for a whole-space matrix group, ``head_dim`` per head, 1 per scaled unit) and
``m`` columns (the rest of the tensor). Writer terms (side ``out``) transform ``Y → M Y``; reader terms
(side ``in``) ``Y → M^{-T} Y``. Everything the solvers need are the sufficient statistics (:class:`Stats`)

    K_out = Σ_out X Yᵀ,  K_in = Σ_in X Yᵀ,  P = Σ_in X Xᵀ,  Q_out = Σ_out Y Yᵀ,  Q_in = Σ_in Y Yᵀ,

batched over units (independent unit-wise transforms) or over unit *pairs* ``(i, j)`` (A's unit ``i``
matched with B's unit ``j``, for the inner solve under a parent permutation). The quantity minimised is the
squared distance restricted to the space's terms,

    D(M) = Σ_out ‖X − M Y‖² + Σ_in ‖X − M^{-T} Y‖²       (``Solver.cost``, up to the constant Σ‖X‖²),

* isometric groups (:class:`IsometricSolver`): ``‖M Y‖ = ‖Y‖``, so minimising ``D`` maximises ``⟨M, K⟩`` with
  ``K = K_out + K_in`` (``M^{-T} = M``): orthogonal Procrustes, ``M = U Vᵀ`` for ``K = U Σ Vᵀ`` (value ``‖K‖_*``;
  Schönemann 1966), or its structured variant (rotary heads, :mod:`.heads`).
* non-isometric matrix groups (:class:`CandidateSolver`): ``D`` has no closed-form minimiser (the reader terms
  involve ``M^{-T}``). The solver evaluates the exact ``D`` of closed-form candidates and keeps the best per
  batch entry:

  1. the minimiser of the least-squares surrogate that measures reader residuals in B's frame,

         S(M) = Σ_out ‖X − M Y‖² + Σ_in ‖Mᵀ X − Y‖² + ε‖M − I‖²,

     which vanishes where ``D`` does (a reader residual ``X = M^{-T} Y`` ⟺ ``Mᵀ X = Y``), so it is exact at
     planted elements; ``S`` is quadratic, its minimiser solves the Sylvester equation
     ``P M + M Q_out + ε M = K_out + K_in + ε I`` (:func:`sylvester`, eigendecompositions of ``P`` and
     ``Q_out``), with ``ε = 1e-7 · (tr P + tr Q_out)/d`` a relative ridge toward the identity (:func:`ridge`;
     units without data keep ``M = I``). On unrelated weights the surrogate can shrink ``M`` until the readers'
     ``M^{-T}`` blows ``D`` up, hence:
  2. the isometric solution ``Q`` and
  3. ``c·Q`` with the best positive scalar ``c`` (:func:`best_scale`: safeguarded Newton on the exact 1-D
     restriction of ``D``).

  So each GL update is at least as good as the best orthogonal (and scaled orthogonal) one.
* ``scaling`` has its own solver (:mod:`.scaling`); permutations are solved by weight matching's linear
  assignment (:data:`ASSIGNMENT`).

The caller keeps a result only where it lowers ``D``. All solves run in fp64 on the statistics' device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .base import Group

RIDGE = 1e-7
SCALE_RANGE = (1e-4, 1e4)


@dataclass
class Stats:
    """Sufficient statistics of the WM objective restricted to one space, fp64, broadcastable batch shapes.

    ``k_out``, ``k_in``: (…, d, d); ``xx_in``: (…, d, d) per A-unit; ``yy_out``, ``yy_in``: (…, d, d) per
    B-unit. For unit pairs: ``k_*`` (n, n, d, d), ``xx_in`` (n, 1, d, d), ``yy_*`` (1, n, d, d).
    """

    k_out: torch.Tensor
    k_in: torch.Tensor
    xx_in: torch.Tensor
    yy_out: torch.Tensor
    yy_in: torch.Tensor

    def take_pairs(self, perm: torch.Tensor) -> Stats:
        """Pair statistics (n, n, …) restricted to the pairs ``(i, perm[i])`` → (n, …)."""
        i = torch.arange(len(perm), device=self.k_out.device)
        perm = perm.to(self.k_out.device)
        return Stats(self.k_out[i, perm], self.k_in[i, perm], self.xx_in[:, 0], self.yy_out[0, perm], self.yy_in[0, perm])


# ---------------------------------------------------------------------------------------------- closed forms
def trace(x: torch.Tensor) -> torch.Tensor:
    """Batched matrix trace."""
    return torch.diagonal(x, dim1=-2, dim2=-1).sum(-1)


def inner(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Batched Frobenius inner product ``⟨a, b⟩``."""
    return (a * b).sum((-1, -2))


def procrustes(k: torch.Tensor) -> torch.Tensor:
    """argmax over orthogonal ``M`` of ``⟨M, K⟩``: ``U Vᵀ`` from the SVD ``K = U Σ Vᵀ`` (batched)."""
    u, _, vh = torch.linalg.svd(k)
    return u @ vh


def ridge(st: Stats) -> torch.Tensor:
    """The relative ridge ``ε = 1e-7 · (tr P + tr Q_out)/d`` of the least-squares surrogate (never 0)."""
    d = st.k_out.shape[-1]
    scale = (trace(st.xx_in).mean() + trace(st.yy_out).mean()) / d
    return RIDGE * scale + 1e-300


def sylvester(p: torch.Tensor, q: torch.Tensor, k: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """The solution of ``P M + M Q + ε M = K + ε I`` for symmetric PSD ``P``, ``Q`` (batched, broadcasting):
    with ``P = U Λ Uᵀ`` and ``Q = V Γ Vᵀ``, ``M = U [(Uᵀ(K + εI)V) / (λ_a + γ_b + ε)] Vᵀ``."""
    lam, u = torch.linalg.eigh(p)
    gam, v = torch.linalg.eigh(q)
    eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)
    rhs = u.transpose(-1, -2) @ (k + eps * eye) @ v
    return u @ (rhs / (lam[..., :, None] + gam[..., None, :] + eps)) @ v.transpose(-1, -2)


def best_scale(s0: torch.Tensor, qo, ko, qi, ki, iters: int = 30) -> torch.Tensor:
    """Minimise ``f(s) = qo·s² − 2·ko·s + qi/s² − 2·ki/s`` over ``s > 0`` (element-wise, batched).

    ``f`` is the distance ``D`` of one positive scalar acting on writers (``s``) and readers (``1/s``).
    Safeguarded Newton steps in ``u = log s`` (step at most ±1, halved until ``f`` decreases), starting at
    ``s0``; never returns a point worse than ``s0``; clamped to ``[1e-4, 1e4]``."""

    def f(u):
        e = torch.exp(u)
        return qo * e * e - 2 * ko * e + qi / (e * e) - 2 * ki / e

    lo, hi = torch.log(torch.tensor(SCALE_RANGE, dtype=s0.dtype))
    u = torch.log(s0.clamp(*SCALE_RANGE))
    fu = f(u)
    for _ in range(iters):
        step = _newton_step(u, qo, ko, qi, ki)
        moved = False
        for _ in range(4):
            cand = (u + step).clamp(float(lo), float(hi))
            fc = f(cand)
            better = fc < fu - 1e-12 * fu.abs()
            if not bool(better.any()):
                step = step / 2
                continue
            moved = True
            u, fu = torch.where(better, cand, u), torch.where(better, fc, fu)
            step = torch.where(better, torch.zeros_like(step), step / 2)
        if not moved:
            break
    return torch.exp(u)


def _newton_step(u: torch.Tensor, qo, ko, qi, ki) -> torch.Tensor:
    """The Newton step of :func:`best_scale` in ``u = log s`` (a unit step downhill where ``f`` is not convex),
    clamped to ±1."""
    e, ie = torch.exp(u), torch.exp(-u)
    d1 = 2 * qo * e * e - 2 * ko * e - 2 * qi * ie * ie + 2 * ki * ie
    d2 = 4 * qo * e * e - 2 * ko * e + 4 * qi * ie * ie - 2 * ki * ie
    step = torch.where(d2 > 0, -d1 / torch.where(d2 > 0, d2, torch.ones_like(d2)), -torch.sign(d1))
    return step.clamp(-1.0, 1.0)


def isometric_cost(m: torch.Tensor, st: Stats) -> torch.Tensor:
    """``D(M) − Σ‖X‖²`` for an isometric ``M``: ``tr Q − 2⟨M, K⟩`` (weight matching leaves ``Q = 0`` for isometric
    groups: a constant that cancels in every comparison)."""
    return trace(st.yy_out) + trace(st.yy_in) - 2 * inner(m, st.k_out + st.k_in)


def general_cost(m: torch.Tensor, st: Stats) -> torch.Tensor:
    """``D(M) − Σ‖X‖²`` per batch entry: ``−2⟨M, K_out⟩ + ‖M Y‖²_out − 2⟨M^{-T}, K_in⟩ + ‖M^{-T} Y‖²_in``.
    ``m``: (…, d, d) fp64 (``d = 1``: scales). A singular ``M`` costs ``+inf``."""
    if m.shape[-1] == 1:
        minv_t, bad = 1.0 / m, (m == 0).reshape(m.shape[:-2])
    else:
        minv, info = torch.linalg.inv_ex(m)
        minv_t, bad = minv.transpose(-1, -2), info != 0
    c = -2 * inner(m, st.k_out) + inner(m @ st.yy_out, m) - 2 * inner(minv_t, st.k_in) + inner(minv_t @ st.yy_in, minv_t)
    return torch.where(bad | ~torch.isfinite(c), torch.full_like(c, torch.inf), c)


# ---------------------------------------------------------------------------------------------- solver kinds
class Solver(ABC):
    """A group's weight-matching solver: the best transform of one space with every other space fixed.

    ``solve(group, st)`` → ``(M, cost)``: per batch entry the transform (…, d, d) fp64 and its :meth:`cost`;
    ``cost(group, m, st)``: ``D(M) − Σ‖X‖²`` per batch entry (see the module docstring).
    """

    @abstractmethod
    def solve(self, group: Group, st: Stats) -> tuple[torch.Tensor, torch.Tensor]:
        """The transform per batch entry and its cost."""

    def cost(self, group: Group, m: torch.Tensor, st: Stats) -> torch.Tensor:
        """``D(M) − Σ‖X‖²`` per batch entry (:func:`general_cost`; isometric solvers override)."""
        return general_cost(m, st)


Best = Callable[["Group", torch.Tensor], torch.Tensor]
"""``best(group, K)``: argmax of ``⟨M, K⟩`` over the group's isometric elements (batched)."""
LeastSquares = Callable[["Group", Stats, torch.Tensor], torch.Tensor]
"""``least_squares(group, st, K)``: the minimiser of the surrogate ``S`` over the group's matrices (batched)."""


class IsometricSolver(Solver):
    """Isometric groups: the exact minimiser of ``D``, ``best(group, K_out + K_in)``."""

    def __init__(self, best: Best) -> None:
        self.best = best

    def solve(self, group, st):
        m = self.best(group, st.k_out + st.k_in)
        return m, self.cost(group, m, st)

    def cost(self, group, m, st):
        return isometric_cost(m, st)


class CandidateSolver(Solver):
    """Non-isometric matrix groups (GL(n), per-head GL(d)): the best (by exact ``D``) of three closed-form
    candidates — the surrogate minimiser ``least_squares`` (exact at planted elements), the isometric solution
    ``Q = best(group, K)`` and ``c·Q`` with ``c`` from :func:`best_scale` — so the result is never worse than
    orthogonal alignment of the same space."""

    def __init__(self, least_squares: LeastSquares, best: Best) -> None:
        self.least_squares, self.best = least_squares, best

    def solve(self, group, st):
        k = st.k_out + st.k_in
        q = self.best(group, k)
        c = best_scale(torch.ones(q.shape[:-2], dtype=q.dtype, device=q.device),
                       trace(st.yy_out), inner(q, st.k_out), trace(st.yy_in), inner(q, st.k_in))
        best_m, best_c = None, None
        for m in (self.least_squares(group, st, k), q, c[..., None, None] * q):
            cm = self.cost(group, m, st)
            if best_m is None:
                best_m, best_c = m, cm
            else:
                better = cm < best_c
                best_m = torch.where(better[..., None, None], m, best_m)
                best_c = torch.where(better, cm, best_c)
        return best_m, best_c


class Assignment:
    """The ``solver`` of permutation groups: weight matching solves the space as a linear assignment problem on
    its (n × n) score — or, for a parent permutation, on ``−D_ij`` over unit pairs with its children solved per
    pair (:mod:`modeconn.match.weight`, :func:`modeconn.match.lap.solve_lap`). It has no closed form on
    :class:`Stats`."""

    def __repr__(self) -> str:
        return "ASSIGNMENT"


ASSIGNMENT = Assignment()
