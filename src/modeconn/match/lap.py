"""Linear assignment (LAP): scipy's dense solver, and for large spaces an exact sparse solve with an optimality
certificate, with the checks that keep NaN/Inf out of the solvers.

*Row maxima* (every method): when each row's largest score lies in a different column, that permutation is
optimal (no assignment sums to more than ``Σ_i max_j S[i, j]``) and no solver runs — one argmax pass, which answers the
scores of a permuted copy (B = g·A perturbed) outright.

*Dense* (``method="dense"``, and ``"auto"`` below :data:`SPARSE_MIN_N` units): ``scipy.optimize.linear_sum_assignment``
(shortest augmenting paths, Crouse 2016), O(n³) worst case.

*Sparse, certified* (``method="sparse"``, and ``"auto"`` from :data:`SPARSE_MIN_N` units). Maximise
``Σ_i S[i, π(i)]`` over permutations π of the (n, n) score ``S``:

1. *Candidates* ``E``: the ``k`` largest scores of every row (:data:`TOP_K`), plus the pairs of a ``hint`` permutation
   (the current element, in weight matching; the identity otherwise), so that ``E`` holds a perfect matching.
2. *Sparse solve*: π, a maximum-score perfect matching using only pairs of ``E``, by
   ``scipy.sparse.csgraph.min_weight_full_bipartite_matching`` (LAPJVsp, Jonker & Volgenant 1987) on the costs
   ``c_i − S[i, j]`` (a per-row constant ``c_i`` changes no solution; it keeps every cost positive).
3. *Potentials*: ``p`` (one per column) with ``S[i, j] + p[j] ≤ S[i, π(i)] + p[π(i)]`` for every ``(i, j) ∈ E``, as
   shortest-path distances (Bellman–Ford from 0 — a virtual source with 0-length arcs to every column —, in later
   rounds from the previous potentials: any start gives valid ones) in the graph on columns with an arc
   ``π(i) → j`` of length ``S[i, π(i)] − S[i, j]`` per candidate ``(i, j)``, ``j ≠ π(i)``: the shortest-path
   inequality ``p[j] ≤ p[π(i)] + S[i, π(i)] − S[i, j]`` is the condition. Such distances exist because π is optimal
   on ``E`` — a negative cycle ``j₁ → j₂ → … → j₁`` would be an exchange along the cycle that raises the score (if
   rounding left one, Bellman–Ford does not settle and the dense solver answers) — and these are the LP dual
   variables ``v_j = p[j]``, ``u_i = −S[i, π(i)] − p[π(i)]`` of the min-cost form ``C = −S`` (reduced costs
   ``C[i, j] − u_i − v_j ≥ 0`` on ``E``, ``= 0`` on π).
4. *Certificate* on the whole dense ``S``: with ``h_i = S[i, π(i)] + p[π(i)]``, check ``S[i, j] + p[j] ≤ h_i`` for
   *every* ``(i, j)`` (one pass over ``S``, row blocks). If it holds, π is optimal on the dense problem: for any
   permutation σ, ``Σ_i S[i, σ(i)] = Σ_i (S[i, σ(i)] + p[σ(i)]) − Σ_j p[j] ≤ Σ_i h_i − Σ_j p[j] = Σ_i S[i, π(i)]``
   (σ and π are bijections, so ``Σ_i p[σ(i)] = Σ_i p[π(i)] = Σ_j p[j]``) — weak LP duality, proved in one line.
5. If the certificate fails, the violating rows get their ``2k`` pairs of largest reduced score ``S[i, j] + p[j]``
   added to ``E`` (pricing, as in column generation: each round adds pairs the certificate rejected, so ``E``
   grows) and steps 2–4 repeat; after :data:`MAX_ROUNDS` failed certificates (or Bellman–Ford not settling within
   its round limit) the dense solver answers. Never an uncertified answer.

Floating point: all arithmetic is fp64 (fp32 scores are read as they are: their fp64 values are exact, so no n×n
fp64 copy is made). Relaxations use the tolerance ``1e-11·max |S on E|``, the certificate
``τ = 1e-11·(max |S on E| + max |p|)``, so by step 4 a certified π is optimal to within ``n·τ`` (the rounding of the
fp64 sums themselves); ties may pick another optimal permutation than the dense solver. Failed certificates and
dense fallbacks are counted in :class:`LapTimer`.

*Per device* (:data:`LAP_POLICIES`, :func:`lap_method`): weight matching computes its scores on the run's device and
asks the policy of that device type which solver gets an (n, n) score (``batch`` scores of one size at a time).
On the CPU the policy is ``"auto"`` — exactly the rule above. On an accelerator the score is copied to the host once
and solved by the same two exact solvers, dense below :data:`SPARSE_MIN_N` units and sparse certified from it: no
batched GPU LAP solver is a dependency, and batched GPU solvers are known to lose to scipy on a few large problems
(they win on many small ones); ``benchmarks/gpu_check.py`` measures the candidates on a GPU before any other entry
is chosen.

*Why not lapx* (re-measured with ``benchmarks/bench_lap.py``, n = 512–8192; ``docs/performance.md``): its
Jonker–Volgenant solvers ``lapjvx`` / ``lapjvs`` (fp64) are exact and win on the scores of a permuted copy — which the
row-maxima exit now answers without any solver — but lose to scipy below :data:`SPARSE_MIN_N` on the flat scores of
independently initialised pairs, and from it to the sparse certified solver on those and on unstructured (uniform)
scores; ``lapjvx`` loses to scipy even on planted scores at the largest size measured; the batched ``lapjvx_batch`` / ``lapjvs_batch``
do not beat a scipy loop on per-head sizes. Re-measured on trained scores (``bench_lap.py --trained``: a trained FFN
pair at n = 512–16k, MiniLM's FFN layer pairs, MiniLM's heads), lapx 0.11's ``lapjvr`` / ``lapjvh`` beat scipy on the
trained FFN pair below :data:`SPARSE_MIN_N` and on per-head sizes, but lose to it on some of MiniLM's layer pairs
(from 512 units on), and lowering :data:`SPARSE_MIN_N` loses on another of them: no choice among them per size is
never slower than this rule, so none is a dependency.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from scipy.sparse import csr_array
from scipy.sparse.csgraph import min_weight_full_bipartite_matching

from ..errors import ConfigError, NonFiniteError

SPARSE_MIN_N = 2048
"""``method="auto"`` solves spaces of at least this many units by the sparse certified solver."""
TOP_K = 48
"""Candidates per row of the sparse solver (twice as many are added per violating row after a failed certificate)."""
MAX_ROUNDS = 4
"""Sparse solves (certificates) before the dense solver answers."""
BF_ROUNDS = 500
"""Bellman–Ford rounds (each relaxes every arc once) before the potentials are given up (dense fallback)."""
_RTOL = 1e-11
_BLOCK = 1 << 16  # entries per row block of the certificate pass (fits in cache)

LapMethod = Literal["auto", "dense", "sparse"]


@dataclass(frozen=True)
class LapPolicy:
    """Which :func:`solve_lap` method solves scores computed on one device type: ``choose(n, batch)`` for ``batch``
    scores of ``n`` units; ``why`` says what the choice rests on."""

    device_type: str
    choose: Callable[[int, int], LapMethod]
    why: str


def _by_size(n: int, batch: int) -> LapMethod:
    return "sparse" if n >= SPARSE_MIN_N else "dense"


LAP_POLICIES: dict[str, LapPolicy] = {p.device_type: p for p in (
    LapPolicy("cpu", lambda n, batch: "auto", "scipy dense below SPARSE_MIN_N, sparse certified from it (lapx's "
                                              "solvers measured, not faster on every score: module docstring)"),
    LapPolicy("cuda", _by_size, "score copied to the host once; scipy dense below SPARSE_MIN_N, sparse certified from "
                                "it (no batched GPU solver measured faster yet: benchmarks/gpu_check.py)"),
    LapPolicy("mps", _by_size, "as cuda"),
    LapPolicy("xpu", _by_size, "as cuda"),
)}
"""LAP solver per device type of the scores (module docstring, "Per device")."""


def lap_method(device: torch.device | str | None, n: int, batch: int = 1) -> LapMethod:
    """The :func:`solve_lap` method for ``batch`` (n, n) scores computed on ``device`` (``None``: the CPU), by
    :data:`LAP_POLICIES`. ConfigError naming the device type when no policy covers it."""
    kind = "cpu" if device is None else torch.device(device).type
    policy = LAP_POLICIES.get(kind)
    if policy is None:
        raise ConfigError(f"no LAP policy for scores on {kind!r} devices; known: {', '.join(LAP_POLICIES)}")
    return policy.choose(n, batch)


def is_sparse(method: LapMethod, n: int) -> bool:
    """Whether :func:`solve_lap` with ``method`` solves an (n, n) score by the sparse certified solver (it reads fp32
    scores as they are; the dense solver makes an fp64 copy)."""
    return method == "sparse" or (method == "auto" and n >= SPARSE_MIN_N)


class LapTimer:
    """Accumulates the wall time (seconds) spent inside LAP solves, and what the sparse solver did."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self.sparse_calls = 0
        self.certificate_failures = 0
        self.dense_fallbacks = 0

    def stats(self) -> dict[str, float | int]:
        """``lap_seconds``, ``lap_calls`` (all solves), ``lap_sparse_calls`` (solves by the sparse certified
        solver), ``lap_certificate_failures`` (certificates that failed, each followed by a larger candidate set or
        the dense solve) and ``lap_dense_fallbacks`` (sparse solves answered by the dense solver)."""
        return {"lap_seconds": self.seconds, "lap_calls": self.calls, "lap_sparse_calls": self.sparse_calls,
                "lap_certificate_failures": self.certificate_failures, "lap_dense_fallbacks": self.dense_fallbacks}


def solve_lap(score: torch.Tensor, space: str, timer: LapTimer | None = None, *, method: LapMethod = "auto",
              hint: torch.Tensor | None = None) -> torch.Tensor:
    """The permutation maximising ``Σ_i score[i, perm[i]]`` (exact; module docstring).

    Args: ``score`` (n, n) similarity of unit i of A with unit j of B; ``space`` names the space in errors;
    ``timer`` accumulates seconds and counts; ``method``: ``"dense"`` (scipy's ``linear_sum_assignment``),
    ``"sparse"`` (sparse candidates + dual certificate, dense fallback) or ``"auto"`` (sparse from
    :data:`SPARSE_MIN_N` units); ``hint``: LongTensor (n,), a permutation whose pairs join the sparse candidates
    (the current element: a good matching that is always available).
    Returns: LongTensor (n,) on the CPU — unit ``i`` of the aligned B is unit ``perm[i]`` of B.
    Raises: :class:`NonFiniteError` naming the space if ``score`` holds NaN or Inf (scipy would reject it
    with an unhelpful message, or worse, return garbage); ConfigError for an unknown ``method`` or a ``hint`` that is
    not a permutation of ``n``.
    """
    if method not in ("auto", "dense", "sparse"):
        raise ConfigError(f"LAP method must be 'auto', 'dense' or 'sparse', got {method!r}")
    start = time.perf_counter()
    src = score.detach().to("cpu")
    if src.dtype not in (torch.float32, torch.float64):
        src = src.to(torch.float64)
    _check_finite(src, space)
    n = src.shape[0]
    timer = timer if timer is not None else LapTimer()
    perm = np.arange(n) if n <= 1 else _row_maxima(src)
    if perm is None and is_sparse(method, n):
        # fp32 scores are read as they are (their fp64 values are exact): no n×n fp64 copy unless the dense solver runs
        timer.sparse_calls += 1
        perm = _sparse_certified(src, _hint(hint, n), timer)
        timer.dense_fallbacks += perm is None
    if perm is None:
        perm = _dense(src.to(torch.float64), score)
    timer.seconds += time.perf_counter() - start
    timer.calls += 1
    return torch.from_numpy(perm)


def _row_maxima(t: torch.Tensor) -> np.ndarray | None:
    """Every row's largest score when those columns are distinct (a permutation), else None.

    Such a permutation is optimal, whatever solver would have run: each row gets its largest score, and no assignment
    sums to more than ``Σ_i max_j S[i, j]``. One pass over ``S``; it answers the scores of a permuted copy (a strong
    diagonal up to the permutation) without a solver, and costs the others one argmax."""
    best = t.argmax(dim=1)
    if int(torch.bincount(best, minlength=t.shape[0]).max()) != 1:
        return None
    return best.numpy().astype(np.int64, copy=False)


def _check_finite(t: torch.Tensor, space: str) -> None:
    """NonFiniteError naming ``space`` if ``t`` holds NaN/Inf: a finite fp64 sum means finite entries (NaN/Inf
    propagate; an overflowing sum is re-checked); the entry-wise test (an n×n temporary) only on failure."""
    if math.isfinite(float(t.sum())) or bool(torch.isfinite(t).all()):
        return
    bad = int((~torch.isfinite(t)).sum())
    raise NonFiniteError(f"cost matrix of space {space!r} ({t.shape[0]}×{t.shape[1]}) has {bad} NaN/Inf entries")


def _hint(hint: torch.Tensor | None, n: int) -> np.ndarray:
    if hint is None:
        return np.arange(n)
    h = hint.detach().to("cpu", torch.int64).numpy()
    if h.shape != (n,) or not np.array_equal(np.sort(h), np.arange(n)):
        raise ConfigError(f"LAP hint must be a permutation of {n} units, got shape {tuple(h.shape)}")
    return h


def _dense(t: torch.Tensor, score: torch.Tensor) -> np.ndarray:
    """scipy's dense solve of the fp64 CPU copy ``t`` of ``score`` (``t`` may share ``score``'s memory)."""
    s = t.numpy()
    # scipy's maximize=True negates a private copy of the whole matrix; negating in place solves the identical
    # problem without that n×n fp64 copy (512 MiB at n = 8192). The caller's fp64 matrix is restored exactly.
    np.negative(s, out=s)
    try:
        rows, cols = linear_sum_assignment(s)
    finally:
        if t.data_ptr() == score.data_ptr():
            np.negative(s, out=s)
    perm = np.empty(s.shape[0], dtype=np.int64)
    perm[rows] = cols
    return perm


def _sparse_certified(t: torch.Tensor, hint: np.ndarray, timer: LapTimer) -> np.ndarray | None:
    """Steps 1–5 of the module docstring on the fp32 or fp64 score ``t``: a certified optimal permutation, or None
    (the dense solver answers). All arithmetic is fp64 (fp32 entries convert exactly)."""
    n = t.shape[0]
    k = min(TOP_K, n)
    top = torch.topk(t, k, dim=1, sorted=False).indices.numpy()
    rows = np.concatenate([np.repeat(np.arange(n), k), np.arange(n)])
    cols = np.concatenate([top.reshape(-1), hint])
    s = t.numpy()
    p = None
    for _ in range(MAX_ROUNDS):
        rows, cols = _unique_pairs(rows, cols, n)
        vals = s[rows, cols].astype(np.float64)
        perm = _sparse_match(rows, cols, vals, n)
        scale = float(np.abs(vals).max())
        p = _potentials(rows, cols, vals, perm, s[np.arange(n), perm].astype(np.float64), _RTOL * scale, p)
        if p is None:
            return None
        tol = _RTOL * (scale + float(np.abs(p).max()))
        bad_rows, bad_cols = _violations(t, perm, p, tol, min(2 * k, n))
        if len(bad_rows) == 0:
            return perm
        timer.certificate_failures += 1
        rows, cols = np.concatenate([rows, bad_rows]), np.concatenate([cols, bad_cols])
    return None


def _unique_pairs(rows: np.ndarray, cols: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (row, col) pairs, sorted by row then column."""
    flat = rows.astype(np.int64) * n + cols
    flat.sort()
    flat = flat[np.r_[True, flat[1:] != flat[:-1]]]
    return flat // n, flat % n


def _sparse_match(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n: int) -> np.ndarray:
    """The maximum-score perfect matching on the candidate pairs (a permutation, row → column)."""
    row_max = np.full(n, -np.inf)
    np.maximum.at(row_max, rows, vals)
    gap = row_max[rows] - vals
    c = float(gap.max()) or 1.0  # costs in [c, 2c]: positive (no explicit zeros), one scale for all rows
    graph = csr_array((gap + c, (rows, cols)), shape=(n, n))
    r, col = min_weight_full_bipartite_matching(graph)
    perm = np.empty(n, dtype=np.int64)
    perm[r] = col
    return perm


def _potentials(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, perm: np.ndarray, matched: np.ndarray,
                tol: float, start: np.ndarray | None = None) -> np.ndarray | None:
    """Column potentials ``p`` with ``vals + p[cols] ≤ matched[rows] + p[perm[rows]] (+ tol)`` on every candidate:
    Bellman–Ford distances over arcs ``perm[i] → j`` of length ``S[i, perm[i]] − S[i, j]`` (step 3), every node
    starting at ``start`` (default 0: a virtual source with 0-length arcs to every column; any start gives feasible
    potentials, ``min`` over paths of start + length, when there is no negative cycle — the previous round's
    potentials settle in fewer rounds), in rounds that relax every arc at once; None if they have not settled after
    :data:`BF_ROUNDS` rounds."""
    off = cols != perm[rows]
    src, dst, length = perm[rows[off]], cols[off], matched[rows[off]] - vals[off]
    order = np.argsort(dst, kind="stable")
    src, dst, length = src[order], dst[order], length[order]
    p = np.zeros(len(perm)) if start is None else start.copy()
    if len(dst) == 0:
        return p
    heads = np.flatnonzero(np.r_[True, dst[1:] != dst[:-1]])
    targets = dst[heads]
    for _ in range(BF_ROUNDS):
        best = np.minimum.reduceat(p[src] + length, heads)
        lower = best < p[targets] - tol
        if not lower.any():
            return p
        p[targets[lower]] = best[lower]
    return None


def _violations(t: torch.Tensor, perm: np.ndarray, p: np.ndarray, tol: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Step 4 over row blocks of ``t``: for every row with some ``S[i, j] + p[j] > h_i + tol``, its ``k`` pairs of
    largest ``S[i, j] + p[j]`` (step 5); empty arrays when the certificate holds."""
    n = t.shape[0]
    pt = torch.from_numpy(p)
    h = torch.from_numpy(t.numpy()[np.arange(n), perm].astype(np.float64) + p[perm]) + tol
    step = max(1, _BLOCK // n)
    buf = torch.empty(min(step, n), n, dtype=torch.float64)
    bad_rows, bad_cols = [], []
    for i in range(0, n, step):
        red = buf[: min(step, n - i)]
        red.copy_(t[i:i + step])  # fp32 → fp64 exactly; blocks that stay in cache
        red.add_(pt)
        bad = torch.nonzero(red.amax(dim=1) > h[i:i + step]).flatten()
        if len(bad):
            idx = torch.topk(red[bad], k, dim=1, sorted=False).indices
            bad_rows.append((bad + i).repeat_interleave(k).numpy())
            bad_cols.append(idx.reshape(-1).numpy())
    if not bad_rows:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    return np.concatenate(bad_rows), np.concatenate(bad_cols)
