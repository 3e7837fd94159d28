"""Tests of modeconn.identifiability (METHODS.md §1): pure tensor math, checked against direct computations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.linalg import hadamard, subspace_angles

from modeconn.errors import ConfigError, ModeconnError, NonFiniteError
from modeconn.identifiability import (
    AssignmentMargin,
    assignment_margin,
    center_separation,
    chord_deviation,
    estimate_subspace,
    identity_vs_optimal,
    max_chord_deviation,
    orthonormalize,
    permutation_sensitivity,
    realization_cost,
    subspace_coherence,
    swap_costs,
)

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _random_basis(d: int, k: int, g: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(d, k, generator=g, dtype=F64)).Q


# ---------------------------------------------------------------------------------------------------------------
# realization_cost


def _reference_cost(U, f, d, a, tol=1e-8):
    """c_i(a_j) by the min-norm solution of Uᵀ diag(d_i) w = a_j − b_i (torch.linalg.pinv / lstsq), +inf if unreachable."""
    m, n = f.shape[0], a.shape[0]
    out = torch.empty(m, n, dtype=F64)
    for i in range(m):
        A = U.mT * d[i]                       # (k, d_in) = Uᵀ diag(d_i)
        A_pinv = torch.linalg.pinv(A)
        for j in range(n):
            r = a[j] - U.mT @ f[i]
            w = A_pinv @ r
            w_ls = torch.linalg.lstsq(A, r[:, None], driver="gelsd").solution[:, 0]
            assert torch.allclose(A @ w, A @ w_ls, atol=1e-8)
            resid = torch.linalg.vector_norm(A @ w - r)
            out[i, j] = math.inf if resid > tol * max(float(torch.linalg.vector_norm(r)), 1e-300) else float(w @ w)
    return out


def _instance(seed: int, deficient: bool):
    g = _gen(seed)
    d_in = int(torch.randint(10, 21, (1,), generator=g))
    k = int(torch.randint(2, 6, (1,), generator=g))
    m = int(torch.randint(4, 7, (1,), generator=g))
    n = m
    U = _random_basis(d_in, k, g)
    f = torch.randn(m, d_in, generator=g, dtype=F64)
    if seed % 2:
        d = (torch.rand(m, d_in, generator=g) > 0.3).to(F64)          # 0/1 mask (reference code)
    else:
        d = torch.randn(m, d_in, generator=g, dtype=F64)               # general real scales
    a = torch.randn(n, k, generator=g, dtype=F64)
    if deficient:
        # row 0: support of size 1 < k -> G_0 has rank 1; row 1: support outside U's rows -> G_1 = 0
        d[0] = 0.0
        d[0, int(torch.randint(0, d_in, (1,), generator=g))] = 1.5
        U = torch.zeros(d_in, k, dtype=F64)
        U[: d_in - 2] = _random_basis(d_in - 2, k, g)                  # coordinates d_in-2, d_in-1 unused
        d[1] = 0.0
        d[1, d_in - 2:] = 1.0
        # planted reachable targets: a_0 reachable for neuron 0, a_1 = b_1 (the only one reachable for neuron 1)
        w = torch.randn(d_in, generator=g, dtype=F64)
        a[0] = U.mT @ (f[0] + d[0] * w)
        a[1] = U.mT @ f[1]
    return U, f, d, a


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("deficient", [False, True])
def test_realization_cost_matches_min_norm_lstsq(seed, deficient):
    U, f, d, a = _instance(seed, deficient)
    got = realization_cost(U, f, d, a)
    ref = _reference_cost(U, f, d, a)
    assert got.dtype == F64 and got.shape == (f.shape[0], a.shape[0])
    assert torch.equal(torch.isinf(got), torch.isinf(ref))
    fin = torch.isfinite(ref)
    assert torch.allclose(got[fin], ref[fin], rtol=1e-7, atol=1e-9)
    if deficient:
        assert math.isfinite(got[0, 0]) and got[1, 1] == 0.0        # planted reachable targets
        assert torch.isinf(got[0, 2:]).all() and torch.isinf(got[1, torch.arange(got.shape[1]) != 1]).all()
    else:
        assert fin.all()


def test_realization_cost_is_the_constrained_minimum():
    U, f, d, a = _instance(3, False)
    c = realization_cost(U, f, d, a)
    i, j = 2, 1
    A = U.mT * d[i]
    r = a[j] - U.mT @ f[i]
    w = torch.linalg.pinv(A) @ r
    assert torch.allclose(U.mT @ (f[i] + d[i] * w), a[j], atol=1e-10)   # feasible
    null = torch.linalg.svd(A).Vh[A.shape[0]:]                          # any feasible w' = w + null-space part
    w2 = w + null.mT @ torch.randn(null.shape[0], generator=_gen(0), dtype=F64)
    assert torch.allclose(U.mT @ (f[i] + d[i] * w2), a[j], atol=1e-10)
    assert float(w @ w) == pytest.approx(float(c[i, j]), rel=1e-9) and float(w2 @ w2) > float(c[i, j])


def test_realization_cost_float32_inputs_and_no_mutation():
    U, f, d, a = (t.to(torch.float32) for t in _instance(5, False))
    copies = [t.clone() for t in (U, f, d, a)]
    c = realization_cost(U, f, d.bool().to(torch.float32), a)
    assert c.dtype == F64 and torch.isfinite(c).all()
    for t, t0 in zip((U, f, d, a), copies, strict=False):
        assert torch.equal(t, t0)


def test_realization_cost_input_errors():
    U, f, d, a = _instance(1, False)
    d_in, k = U.shape
    with pytest.raises(ConfigError, match="k=.*columns.*d_in"):
        realization_cost(torch.eye(3, 5, dtype=F64), f[:, :3], d[:, :3], torch.zeros(2, 5))
    with pytest.raises(ConfigError, match="orthonormal.*orthonormalize"):
        realization_cost(2 * U, f, d, a)
    with pytest.raises(ConfigError, match=r"f has shape .* but U has shape"):
        realization_cost(U, f[:, :-1], d, a)
    with pytest.raises(ConfigError, match=r"d has shape \(.*\) but f has shape"):
        realization_cost(U, f, d[:-1], a)
    with pytest.raises(ConfigError, match=rf"a has shape \(.*, {k + 1}\) but U has shape \({d_in}, {k}\)"):
        realization_cost(U, f, d, torch.zeros(3, k + 1))
    with pytest.raises(ConfigError, match="U must be 2-D"):
        realization_cost(U[0], f, d, a)
    for name, idx in (("U", 0), ("f", 1), ("d", 2), ("a", 3)):
        args = [t.clone() for t in (U, f, d, a)]
        args[idx][0, 0] = math.nan
        with pytest.raises(NonFiniteError, match=rf"^{name} "):
            realization_cost(*args)
    bad_f = f.clone()
    bad_f[1, 2] = math.inf
    with pytest.raises(NonFiniteError, match="f .*NaN/Inf"):
        realization_cost(U, bad_f, d, a)
    with pytest.raises(ConfigError, match="rtol"):
        realization_cost(U, f, d, a, rtol=-1.0)
    assert issubclass(ConfigError, ModeconnError)


def test_orthonormalize():
    g = _gen(0)
    M = torch.randn(12, 4, generator=g, dtype=F64)
    Q = orthonormalize(M)
    assert torch.allclose(Q.mT @ Q, torch.eye(4, dtype=F64), atol=1e-12)
    R = Q.mT @ M
    assert torch.allclose(R, torch.triu(R), atol=1e-10) and (torch.diagonal(R) > 0).all()   # sign convention
    assert torch.allclose(orthonormalize(Q), Q, atol=1e-12)                                   # idempotent
    realization_cost(Q, torch.zeros(2, 12), torch.ones(2, 12), torch.zeros(3, 4))            # now accepted
    with pytest.raises(ConfigError, match="rank-deficient"):
        orthonormalize(torch.cat([M[:, :2], M[:, :2]], dim=1))
    with pytest.raises(ConfigError):
        orthonormalize(torch.randn(3, 5))


# ---------------------------------------------------------------------------------------------------------------
# coherence, PCA, center separation


def test_coherence_extremes_and_range():
    H = torch.tensor(hadamard(16), dtype=F64) / 4.0            # orthogonal, every entry ±1/4
    for k in (1, 2, 5, 16):
        assert subspace_coherence(H[:, :k]) == pytest.approx(1.0, abs=1e-12)
    # real DFT-like basis of R^d: columns 1/√d, √(2/d)cos, √(2/d)sin — every row has the same leverage
    dd = 9
    t = torch.arange(dd, dtype=F64)
    cols = [torch.full((dd,), 1 / math.sqrt(dd), dtype=F64)]
    cols += [math.sqrt(2 / dd) * torch.cos(2 * math.pi * t / dd), math.sqrt(2 / dd) * torch.sin(2 * math.pi * t / dd)]
    assert subspace_coherence(torch.stack(cols, 1)) == pytest.approx(1.0, abs=1e-12)
    eye = torch.eye(20, dtype=F64)
    for k in (1, 3, 7):
        assert subspace_coherence(eye[:, [2, 11, 5, 0, 19, 8, 13][:k]]) == 20 / k
    g = _gen(1)
    for _ in range(10):
        U = _random_basis(20, 3, g)
        assert 1.0 - 1e-12 <= subspace_coherence(U) <= 20 / 3 + 1e-12
    with pytest.raises(ConfigError, match="orthonormal"):
        subspace_coherence(torch.ones(5, 2))


def test_estimate_subspace_recovers_planted_subspace():
    g = _gen(2)
    d, k, n = 15, 3, 400
    U = _random_basis(d, k, g)
    X = (torch.randn(n, k, generator=g, dtype=F64) * torch.tensor([5.0, 3.0, 2.0], dtype=F64)) @ U.mT + 7.0
    X = X + 1e-3 * torch.randn(n, d, generator=g, dtype=F64)
    Uh, ratio = estimate_subspace(X, k=k)
    assert Uh.shape == (d, k) and ratio.shape == (k,)
    assert torch.allclose(Uh.mT @ Uh, torch.eye(k, dtype=F64), atol=1e-12)
    assert np.max(subspace_angles(U.numpy(), Uh.numpy())) < 1e-3
    assert float(ratio.sum()) > 0.999 and bool((ratio[:-1] >= ratio[1:]).all())
    U2, r2 = estimate_subspace(X.to(torch.float32), explained_variance=0.99)
    assert U2.shape == (d, k) and r2.shape == (k,)
    U1, _ = estimate_subspace(X, explained_variance=0.5)
    assert U1.shape == (d, 1)
    with pytest.raises(ConfigError, match="exactly one"):
        estimate_subspace(X)
    with pytest.raises(ConfigError, match="exactly one"):
        estimate_subspace(X, k=2, explained_variance=0.9)
    with pytest.raises(ConfigError, match=r"k must be .*\[1, 5\]"):
        estimate_subspace(X[:5], k=6)
    with pytest.raises(ConfigError, match="explained_variance"):
        estimate_subspace(X, explained_variance=1.5)
    bad = X.clone()
    bad[3, 3] = math.nan
    with pytest.raises(NonFiniteError, match="X"):
        estimate_subspace(bad, k=2)


def test_center_separation():
    U = torch.eye(4, dtype=F64)[:, :2]
    f = torch.tensor([[0.0, 0, 9, 9], [3.0, 4, 0, 0], [6.0, 8, 1, 1]], dtype=F64)   # b = (0,0), (3,4), (6,8)
    s = center_separation(U, f)
    assert s["min"] == pytest.approx(5.0) and s["mean"] == pytest.approx(20 / 3) and s["median"] == pytest.approx(5.0)
    assert s["nn_mean"] == pytest.approx(5.0) and s["center_norm_mean"] == pytest.approx(5.0)
    assert s["min_ratio"] == pytest.approx(1.0) and s["mean_ratio"] == pytest.approx(4 / 3)
    assert s["m"] == 3 and s["k"] == 2
    assert math.isnan(center_separation(U, torch.zeros(3, 4))["min_ratio"])
    with pytest.raises(ConfigError, match="at least 2"):
        center_separation(U, f[:1])
    with pytest.raises(ConfigError, match=r"f has shape \(3, 3\) but U has shape \(4, 2\)"):
        center_separation(U, f[:, :3])
    # more neurons in a fixed k crowd the projected centers (METHODS.md §1)
    g = _gen(3)
    Ur = _random_basis(30, 2, g)
    few = center_separation(Ur, torch.randn(4, 30, generator=g, dtype=F64))["nn_mean_ratio"]
    many = center_separation(Ur, torch.randn(200, 30, generator=g, dtype=F64))["nn_mean_ratio"]
    assert many < few


# ---------------------------------------------------------------------------------------------------------------
# assignments


def _brute(C: np.ndarray):
    n = C.shape[0]
    perms = np.array(list(itertools.permutations(range(n))))
    costs = C[np.arange(n), perms].sum(axis=1)
    return perms, costs, np.sort(costs)


def _random_cost(rng: np.random.Generator, n: int, case: int) -> np.ndarray:
    if case == 0:
        C = rng.normal(size=(n, n))
    elif case == 1:
        C = rng.integers(0, 3, size=(n, n)).astype(float)              # many ties
    elif case == 2:
        C = rng.integers(0, 4, size=(n, n)).astype(float)
        C[rng.random((n, n)) < 0.35] = np.inf                            # inf entries
    else:
        C = rng.normal(size=(n, n)) * 100
        C[rng.random((n, n)) < 0.6] = np.inf                             # often infeasible
    return C


def test_assignment_margin_matches_brute_force():
    rng = np.random.default_rng(0)
    checked_inf = checked_tie = 0
    for trial in range(240):
        n = 1 + trial % 6
        C = _random_cost(rng, n, trial % 4)
        res = assignment_margin(torch.tensor(C))
        assert isinstance(res, AssignmentMargin)
        _, _, sorted_costs = _brute(C)
        best = sorted_costs[0]
        second = sorted_costs[1] if n > 1 else math.inf
        p = res.perm.numpy()
        assert sorted(p.tolist()) == list(range(n))
        assert C[np.arange(n), p].sum() == pytest.approx(best) if math.isfinite(best) else math.isinf(res.cost)
        assert res.cost == pytest.approx(best) if math.isfinite(best) else math.isinf(res.cost)
        if n == 1:
            assert res.second_perm is None and res.second_cost == math.inf and res.margin == math.inf
            continue
        sp = res.second_perm.numpy()
        assert not np.array_equal(sp, p) and sorted(sp.tolist()) == list(range(n))
        assert C[np.arange(n), sp].sum() == pytest.approx(res.second_cost) or (
            math.isinf(res.second_cost) and math.isinf(C[np.arange(n), sp].sum()))
        if math.isfinite(second):
            assert res.second_cost == pytest.approx(second, abs=1e-9)
            assert res.margin == pytest.approx(second - best, abs=1e-9)
            checked_tie += second == best
        else:
            assert math.isinf(res.second_cost)
            assert res.margin == (0.0 if math.isinf(best) else math.inf)
            checked_inf += 1
    assert checked_inf > 5 and checked_tie > 5


def test_assignment_margin_identity_unique_and_errors():
    C = torch.tensor([[0.0, 5, 5], [5, 0, 5], [5, 5, 0]])
    res = assignment_margin(C)
    assert res.perm.tolist() == [0, 1, 2] and res.cost == 0 and res.margin == 10.0
    with pytest.raises(NonFiniteError, match="C"):
        assignment_margin(torch.tensor([[0.0, math.nan], [1, 2]]))
    with pytest.raises(NonFiniteError, match="C"):
        assignment_margin(torch.tensor([[0.0, -math.inf], [1, 2]]))
    with pytest.raises(ConfigError, match=r"square .* \(2, 3\)"):
        assignment_margin(torch.zeros(2, 3))


def test_swap_costs_and_permutation_sensitivity():
    g = _gen(4)
    for n in (1, 2, 5):
        C = torch.randn(n, n, generator=g, dtype=F64)
        for perm in (None, torch.randperm(n, generator=g)):
            delta = swap_costs(C, perm)
            p = torch.arange(n) if perm is None else perm
            base = float(C[torch.arange(n), p].sum())
            for i in range(n):
                for j in range(n):
                    q = p.clone()
                    q[i], q[j] = p[j], p[i]
                    assert float(delta[i, j]) == pytest.approx(float(C[torch.arange(n), q].sum()) - base, abs=1e-12)
            assert torch.equal(delta, delta.mT) and bool((torch.diagonal(delta) == 0).all())
            # Δ_π for the transposition (i j) with respect to the identity is the identity's swap cost
            if perm is None and n > 1:
                q = torch.arange(n)
                q[0], q[1] = 1, 0
                assert permutation_sensitivity(C, q) == pytest.approx(float(delta[0, 1]))
        pi = torch.randperm(n, generator=g)
        assert permutation_sensitivity(C, pi) == pytest.approx(
            float(C[torch.arange(n), pi].sum() - torch.trace(C)), abs=1e-12)
    C = torch.tensor([[0.0, math.inf], [1.0, 2.0]])
    assert swap_costs(C)[0, 1] == math.inf and permutation_sensitivity(C, [1, 0]) == math.inf
    with pytest.raises(ConfigError, match="perm is not a permutation"):
        swap_costs(torch.zeros(3, 3), [0, 0, 1])
    with pytest.raises(ConfigError, match=r"perm must have shape \(3,\)"):
        permutation_sensitivity(torch.zeros(3, 3), [0, 1])
    with pytest.raises(NonFiniteError):
        swap_costs(torch.tensor([[math.nan]]))


def test_realization_cost_feeds_assignment():
    """Identity is uniquely cheapest when each neuron's center sits at its own target (center-dominated)."""
    g = _gen(5)
    d_in, k, m = 12, 4, 5
    U = _random_basis(d_in, k, g)
    f = 10 * torch.randn(m, d_in, generator=g, dtype=F64)
    d = torch.ones(m, d_in, dtype=F64)
    a = f @ U + 0.1 * torch.randn(m, k, generator=g, dtype=F64)
    C = realization_cost(U, f, d, a)
    res = assignment_margin(C)
    assert res.perm.tolist() == list(range(m)) and res.margin > 0
    assert bool((swap_costs(C)[~torch.eye(m, dtype=torch.bool)] > 0).all())


def test_identity_vs_optimal():
    g = _gen(6)
    n = 6
    corr = 0.1 * torch.rand(n, n, generator=g, dtype=F64) + torch.eye(n, dtype=F64)
    r = identity_vs_optimal(corr)
    assert r["ratio"] == 1.0 and r["gap"] == 0.0 and r["perm"].tolist() == list(range(n))
    perm = torch.tensor([2, 0, 1, 5, 3, 4])
    r2 = identity_vs_optimal(corr[:, perm])
    assert r2["ratio"] < 1.0 and r2["optimal"] == pytest.approx(r["optimal"])
    assert r2["identity"] == pytest.approx(float(torch.trace(corr[:, perm])))
    assert identity_vs_optimal(torch.zeros(3, 3))["ratio"] == 1.0                  # optimal ≤ 0, identity optimal
    neg = -torch.ones(3, 3, dtype=F64) - torch.eye(3, dtype=F64)                     # identity strictly worse, opt < 0
    assert math.isnan(identity_vs_optimal(neg)["ratio"]) and identity_vs_optimal(neg)["gap"] == pytest.approx(3.0)
    with pytest.raises(NonFiniteError, match="corr"):
        identity_vs_optimal(torch.tensor([[1.0, math.nan], [0, 1]]))
    with pytest.raises(NonFiniteError, match="corr"):
        identity_vs_optimal(torch.tensor([[1.0, math.inf], [0, 1]]))


# ---------------------------------------------------------------------------------------------------------------
# chord deviation


def test_chord_deviation():
    g = _gen(7)
    lam = torch.linspace(0, 1, 11, dtype=F64)
    A, B = torch.randn(8, 3, generator=g, dtype=F64), torch.randn(8, 3, generator=g, dtype=F64)
    lin = (1 - lam)[:, None, None] * A + lam[:, None, None] * B
    assert chord_deviation(lin, lam).abs().max() < 1e-12
    lam2 = 0.2 + 0.5 * lam                                          # non-[0,1] grid: normalised position
    assert chord_deviation(lin, lam2).abs().max() < 1e-12
    bump = lin + (lam * (1 - lam))[:, None, None] * torch.tensor([3.0, 4.0, 0.0], dtype=F64)
    dev = chord_deviation(bump, lam)
    assert dev.shape == (11,) and dev.dtype == F64
    assert torch.allclose(dev, 5 * lam * (1 - lam), atol=1e-12)
    assert max_chord_deviation(bump, lam) == pytest.approx(1.25)
    assert chord_deviation(lin[..., 0].to(torch.float32), lam).abs().max() < 1e-6   # (L, N) is K = 1
    with pytest.raises(ConfigError, match="strictly increasing"):
        chord_deviation(lin, lam.flip(0))
    with pytest.raises(ConfigError, match=r"lambdas has shape \(10,\) but outputs has shape \(11, 8, 3\)"):
        chord_deviation(lin, lam[:10])
    bad = lin.clone()
    bad[3, 2, 1] = math.nan
    with pytest.raises(NonFiniteError, match="outputs"):
        chord_deviation(bad, lam)
