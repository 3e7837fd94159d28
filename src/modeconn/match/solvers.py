"""Closed-form per-space solvers of weight matching for continuous groups (orthogonal, invertible, scaling,
per-head transforms with or without the rotary restriction).

Weight matching (METHODS.md §0; Ainsworth et al. 2023, "git re-basin") updates one space at a time with the
others fixed. For a space, every bound tensor axis ("term") contributes a pair of unit matrices: ``X`` from
θ_A and ``Y`` from θ_B with every other space already applied, each of shape ``(…, d, m)`` — ``d`` rows
per unit transform (``n`` for a whole-space matrix group, ``head_dim`` per head, 1 per scaled unit) and
``m`` columns (the rest of the tensor). Writer terms (side ``out``) transform ``Y → M Y``; reader terms
(side ``in``) ``Y → M^{-T} Y``. Everything the solvers need are the sufficient statistics (:class:`Stats`)

    K_out = Σ_out X Yᵀ,  K_in = Σ_in X Yᵀ,  P = Σ_in X Xᵀ,  Q_out = Σ_out Y Yᵀ,  Q_in = Σ_in Y Yᵀ,

batched over units (independent unit-wise transforms) or over unit *pairs* ``(i, j)`` (A's unit ``i``
matched with B's unit ``j``, for the inner solve under a parent permutation). The quantity minimised is the
squared distance restricted to the space's terms,

    D(M) = Σ_out ‖X − M Y‖² + Σ_in ‖X − M^{-T} Y‖²       (:func:`cost`, up to the constant Σ‖X‖²),

* isometric groups (``orthogonal``, ``head_orthogonal``): ``‖M Y‖ = ‖Y‖``, so minimising ``D`` maximises
  ``⟨M, K⟩`` with ``K = K_out + K_in`` (``M^{-T} = M``): orthogonal Procrustes, ``M = U Vᵀ`` for
  ``K = U Σ Vᵀ`` (value ``‖K‖_*``; Schönemann 1966). Rotary-restricted heads: on each rotated pair
  ``(p, q)`` the best rotation has ``(cos φ, sin φ) ∝ (K_pp + K_qq, K_qp − K_pq)``; Procrustes on the
  pass-through block.
* non-isometric groups (``invertible``, ``head_invertible``, ``scaling``): ``D`` has no closed-form
  minimiser (the reader terms involve ``M^{-T}``). The solvers evaluate the exact ``D`` of closed-form
  candidates and keep the best per batch entry:

  1. the minimiser of the least-squares surrogate that measures reader residuals in B's frame,

         S(M) = Σ_out ‖X − M Y‖² + Σ_in ‖Mᵀ X − Y‖² + ε‖M − I‖²,

     which vanishes where ``D`` does (a reader residual ``X = M^{-T} Y`` ⟺ ``Mᵀ X = Y``), so it is exact at
     planted elements; ``S`` is quadratic, its minimiser solves the Sylvester equation
     ``P M + M Q_out + ε M = K_out + K_in + ε I`` (:func:`sylvester`, eigendecompositions of ``P`` and
     ``Q_out``), with ``ε = 1e-7 · (tr P + tr Q_out)/d`` a relative ridge toward the identity (units without
     data keep ``M = I``). Rotary heads: block-diagonal ``M`` makes ``S`` separate over the blocks; each
     rotary pair's scaled rotation ``aI + bJ`` is ``(a, b) = (k₁ + 2ε, k₂)/(tr P_pair + tr Q_pair + 2ε)``
     with ``k₁ = K_pp + K_qq``, ``k₂ = K_qp − K_pq``; a Sylvester solve on the pass-through block.
     On unrelated weights the surrogate can shrink ``M`` until the readers' ``M^{-T}`` blows ``D`` up, hence:
  2. the isometric solution ``Q`` (Procrustes / rotary rotations) and
  3. ``c·Q`` with the best positive scalar ``c`` (:func:`best_scale`: safeguarded Newton on the exact 1-D
     restriction of ``D``).

  So each GL update is at least as good as the best orthogonal (and scaled orthogonal) one. ``scaling`` (``d = 1``): the
  better of ``s = (K + ε)/(P + Q_out + ε)`` (clamped to ``[1e-4, 1e4]``) and ``s = 1``, refined on the exact
  per-unit ``D`` by :func:`best_scale`. The caller keeps a result only where it lowers ``D``.

All solves run in fp64 on the statistics' device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..symmetry.groups import Group

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


def _trace(x: torch.Tensor) -> torch.Tensor:
    return torch.diagonal(x, dim1=-2, dim2=-1).sum(-1)


def _inner(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum((-1, -2))


def procrustes(k: torch.Tensor) -> torch.Tensor:
    """argmax over orthogonal ``M`` of ``⟨M, K⟩``: ``U Vᵀ`` from the SVD ``K = U Σ Vᵀ`` (batched)."""
    u, _, vh = torch.linalg.svd(k)
    return u @ vh


def _ridge(st: Stats) -> torch.Tensor:
    d = st.k_out.shape[-1]
    scale = (_trace(st.xx_in).mean() + _trace(st.yy_out).mean()) / d
    return RIDGE * scale + 1e-300


def sylvester(p: torch.Tensor, q: torch.Tensor, k: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """The solution of ``P M + M Q + ε M = K + ε I`` for symmetric PSD ``P``, ``Q`` (batched, broadcasting):
    with ``P = U Λ Uᵀ`` and ``Q = V Γ Vᵀ``, ``M = U [(Uᵀ(K + εI)V) / (λ_a + γ_b + ε)] Vᵀ``."""
    lam, u = torch.linalg.eigh(p)
    gam, v = torch.linalg.eigh(q)
    eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)
    rhs = u.transpose(-1, -2) @ (k + eps * eye) @ v
    return u @ (rhs / (lam[..., :, None] + gam[..., None, :] + eps)) @ v.transpose(-1, -2)


def _isometric_part(group: Group, k: torch.Tensor) -> torch.Tensor:
    """argmax of ``⟨M, K⟩`` over the isometric subgroup: O(d), or rotations on rotary pairs × O(d−r)."""
    rot = getattr(group, "rotary_dims", 0)
    if not rot:
        return procrustes(k)
    p, q = group.pairs
    k1 = k[..., p, p] + k[..., q, q]
    k2 = k[..., q, p] - k[..., p, q]
    norm = torch.sqrt(k1 * k1 + k2 * k2)
    zero = norm == 0
    safe = torch.where(zero, torch.ones_like(norm), norm)
    a = torch.where(zero, torch.ones_like(k1), k1 / safe)
    b = torch.where(zero, torch.zeros_like(k2), k2 / safe)
    return group.assemble(a, b, procrustes(k[..., rot:, rot:]))


def _least_squares(group: Group, st: Stats, k: torch.Tensor) -> torch.Tensor:
    """The minimiser of the surrogate ``S`` (see the module docstring), structured for rotary heads."""
    eps = _ridge(st)
    rot = getattr(group, "rotary_dims", 0)
    if not rot:
        return sylvester(st.xx_in, st.yy_out, k, eps)
    p, q = group.pairs
    k1 = k[..., p, p] + k[..., q, q]
    k2 = k[..., q, p] - k[..., p, q]
    tr = st.xx_in[..., p, p] + st.xx_in[..., q, q] + st.yy_out[..., p, p] + st.yy_out[..., q, q]
    a, b = torch.broadcast_tensors((k1 + 2 * eps) / (tr + 2 * eps), k2 / (tr + 2 * eps))
    rest = sylvester(st.xx_in[..., rot:, rot:], st.yy_out[..., rot:, rot:], k[..., rot:, rot:], eps)
    return group.assemble(a, b, rest)


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
        e, ie = torch.exp(u), torch.exp(-u)
        d1 = 2 * qo * e * e - 2 * ko * e - 2 * qi * ie * ie + 2 * ki * ie
        d2 = 4 * qo * e * e - 2 * ko * e + 4 * qi * ie * ie - 2 * ki * ie
        step = torch.where(d2 > 0, -d1 / torch.where(d2 > 0, d2, torch.ones_like(d2)), -torch.sign(d1))
        step = step.clamp(-1.0, 1.0)
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


def solve(group: Group, st: Stats) -> tuple[torch.Tensor, torch.Tensor]:
    """Per batch entry, the transform (…, d, d) and its :func:`cost`.

    Isometric groups: the exact minimiser of ``D`` (Procrustes, rotary rotations). ``scaling``: the better of
    the surrogate solution and ``1``, refined by :func:`best_scale` on the exact ``D``. ``invertible`` and
    ``head_invertible``: the best (by exact ``D``) of three closed-form candidates — the surrogate minimiser
    (exact at planted elements), the isometric solution ``Q`` and ``c·Q`` with ``c`` from
    :func:`best_scale` — so the result is never worse than orthogonal alignment of the same space."""
    k = st.k_out + st.k_in
    if group.isometric:
        m = _isometric_part(group, k)
        return m, cost(group, m, st)
    if group.name == "scaling":  # one positive scalar per unit (d = 1)
        eps = _ridge(st)
        ls = ((k + eps) / (st.xx_in + st.yy_out + eps)).clamp(*SCALE_RANGE)
        qo, ko, qi, ki = st.yy_out, st.k_out, st.yy_in, st.k_in
        start = torch.where(cost(group, ls, st) < cost(group, torch.ones_like(ls), st), ls[..., 0, 0], torch.ones_like(ls[..., 0, 0]))
        qo, ko, qi, ki = (torch.broadcast_to(x, ls.shape)[..., 0, 0] for x in (qo, ko, qi, ki))
        m = best_scale(start, qo, ko, qi, ki)[..., None, None]
        return m, cost(group, m, st)
    q = _isometric_part(group, k)
    c = best_scale(torch.ones(q.shape[:-2], dtype=q.dtype, device=q.device),
                   _trace(st.yy_out), _inner(q, st.k_out), _trace(st.yy_in), _inner(q, st.k_in))
    best_m, best_c = None, None
    for m in (_least_squares(group, st, k), q, c[..., None, None] * q):
        cm = cost(group, m, st)
        if best_m is None:
            best_m, best_c = m, cm
        else:
            better = cm < best_c
            best_m = torch.where(better[..., None, None], m, best_m)
            best_c = torch.where(better, cm, best_c)
    return best_m, best_c


def cost(group: Group, m: torch.Tensor, st: Stats) -> torch.Tensor:
    """``D(M) − Σ‖X‖²`` per batch entry: ``−2⟨M, K_out⟩ + ‖M Y‖²_out − 2⟨M^{-T}, K_in⟩ + ‖M^{-T} Y‖²_in``
    (``tr Q − 2⟨M, K⟩`` for isometric groups, where weight matching leaves ``Q = 0``: a constant that cancels in
    every comparison). ``m``: (…, d, d) fp64. A singular ``M`` costs ``+inf``."""
    if group.isometric:
        return _trace(st.yy_out) + _trace(st.yy_in) - 2 * _inner(m, st.k_out + st.k_in)
    if m.shape[-1] == 1:
        minv_t, bad = 1.0 / m, (m == 0).reshape(m.shape[:-2])
    else:
        minv, info = torch.linalg.inv_ex(m)
        minv_t, bad = minv.transpose(-1, -2), info != 0
    c = -2 * _inner(m, st.k_out) + _inner(m @ st.yy_out, m) - 2 * _inner(minv_t, st.k_in) + _inner(minv_t @ st.yy_in, minv_t)
    return torch.where(bad | ~torch.isfinite(c), torch.full_like(c, torch.inf), c)
