"""The exact LAP: sparse candidates + dual certificate (``modeconn.match.lap``) against scipy's dense optimum, including
matrices whose optimum lies outside the candidates (the certificate must fail, then pricing or the dense fallback
answers), and weight matching with the sparse solver in the loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from archs import make
from scipy.optimize import linear_sum_assignment

import modeconn as mc
from modeconn.errors import ConfigError
from modeconn.match import lap as lap_mod
from modeconn.match.lap import LapTimer, solve_lap

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def small_k(monkeypatch):
    """8 candidates per row: on these small matrices the default would make every pair a candidate."""
    monkeypatch.setattr(lap_mod, "TOP_K", 8)


def _dense_optimum(s: np.ndarray) -> float:
    r, c = linear_sum_assignment(s, maximize=True)
    return float(s[r, c].sum())


def _objective(s: np.ndarray, perm: torch.Tensor) -> float:
    return float(s[np.arange(len(perm)), perm.numpy()].sum())


def _matrix(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "uniform":
        return rng.random((n, n))
    if kind == "wm-like":
        a = rng.standard_normal((n, 24))
        return a @ (0.5 * a[rng.permutation(n)] + rng.standard_normal((n, 24))).T
    if kind == "ties":
        return np.round(rng.standard_normal((n, n)), 1)
    if kind == "hubs":  # every row's top-k is in the same 20 columns: the top-k candidates hold no perfect matching
        s = rng.standard_normal((n, n))
        s[:, :20] += 10.0
        return s
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["uniform", "wm-like", "ties", "hubs"])
@pytest.mark.parametrize("n", [37, 180])
@pytest.mark.usefixtures("small_k")
def test_sparse_solver_reaches_the_dense_optimum(kind, n):
    rng = np.random.default_rng(n)
    for _ in range(3):
        s = _matrix(kind, n, rng)
        timer = LapTimer()
        perm = solve_lap(torch.from_numpy(s.copy()), "P", timer, method="sparse")
        assert sorted(perm.tolist()) == list(range(n))
        assert _objective(s, perm) == pytest.approx(_dense_optimum(s), rel=1e-12, abs=1e-9)
        assert timer.sparse_calls == 1 and timer.calls == 1
    if kind == "hubs":  # the optimum is not among the candidates: the certificate must have failed at least once
        assert timer.certificate_failures >= 1


@pytest.mark.usefixtures("small_k")
def test_dense_fallback_when_the_certificate_keeps_failing(monkeypatch):
    monkeypatch.setattr(lap_mod, "MAX_ROUNDS", 1)  # one sparse solve, then the dense solver
    s = _matrix("hubs", 150, np.random.default_rng(0))
    timer = LapTimer()
    perm = solve_lap(torch.from_numpy(s.copy()), "P", timer, method="sparse")
    assert timer.certificate_failures == 1 and timer.dense_fallbacks == 1
    assert _objective(s, perm) == pytest.approx(_dense_optimum(s), rel=1e-12)


@pytest.mark.usefixtures("small_k")
def test_negative_control_a_vacuous_certificate_returns_a_suboptimal_permutation(monkeypatch):
    """Without the certificate the sparse answer on the hub matrix is wrong: the tests above can fail."""
    monkeypatch.setattr(lap_mod, "_violations", lambda *a: (np.empty(0, np.int64), np.empty(0, np.int64)))
    s = _matrix("hubs", 150, np.random.default_rng(0))
    perm = solve_lap(torch.from_numpy(s.copy()), "P", method="sparse")
    assert _objective(s, perm) < _dense_optimum(s) - 1e-6


def test_potentials_certify_the_optimum_and_reject_a_suboptimal_matching():
    s = _matrix("wm-like", 60, np.random.default_rng(3))
    n = len(s)
    rows, cols = np.repeat(np.arange(n), n), np.tile(np.arange(n), n)  # every pair a candidate
    vals = s[rows, cols]
    _, opt = linear_sum_assignment(s, maximize=True)
    p = lap_mod._potentials(rows, cols, vals, opt, s[np.arange(n), opt], 1e-12)
    assert p is not None
    bad_rows, _ = lap_mod._violations(torch.from_numpy(s), opt, p, 1e-9, 4)
    assert len(bad_rows) == 0
    worse = opt.copy()
    worse[[0, 1]] = worse[[1, 0]]  # a different permutation with a lower score has a negative cycle
    assert _objective(s, torch.from_numpy(worse)) < _objective(s, torch.from_numpy(opt))
    assert lap_mod._potentials(rows, cols, vals, worse, s[np.arange(n), worse], 1e-12) is None


def test_hint_joins_the_candidates_and_bad_input_is_rejected():
    s = _matrix("uniform", 40, np.random.default_rng(1))
    hint = torch.randperm(40, generator=torch.Generator().manual_seed(0))
    perm = solve_lap(torch.from_numpy(s.copy()), "P", method="sparse", hint=hint)
    assert _objective(s, perm) == pytest.approx(_dense_optimum(s), rel=1e-12)
    with pytest.raises(ConfigError, match="permutation of 40"):
        solve_lap(torch.from_numpy(s), "P", method="sparse", hint=torch.zeros(40, dtype=torch.long))
    with pytest.raises(ConfigError, match="method"):
        solve_lap(torch.from_numpy(s), "P", method="approximate")
    bad = s.copy()
    bad[3, 4] = np.nan
    with pytest.raises(mc.errors.NonFiniteError, match="'P_x'"):
        solve_lap(torch.from_numpy(bad), "P_x", method="sparse")


def test_auto_uses_the_sparse_solver_from_the_threshold(monkeypatch):
    monkeypatch.setattr(lap_mod, "SPARSE_MIN_N", 50)
    rng = np.random.default_rng(2)
    timer = LapTimer()
    solve_lap(torch.from_numpy(rng.random((49, 49))), "P", timer)
    assert timer.sparse_calls == 0
    solve_lap(torch.from_numpy(rng.random((50, 50))), "P", timer)
    assert timer.sparse_calls == 1 and timer.calls == 2
    st = timer.stats()
    assert set(st) == {"lap_seconds", "lap_calls", "lap_sparse_calls", "lap_certificate_failures", "lap_dense_fallbacks"}


def test_the_callers_score_is_left_unchanged():
    s = torch.from_numpy(_matrix("hubs", 90, np.random.default_rng(4)))
    before = s.clone()
    solve_lap(s, "P", method="sparse")
    solve_lap(s, "P", method="dense")
    assert torch.equal(s, before)


@pytest.mark.parametrize("arch", ["mlp", "vgg-bn"])
@pytest.mark.usefixtures("small_k")
def test_weight_matching_with_the_sparse_solver_equals_the_dense_one(arch, monkeypatch):
    a, x = make(arch, seed=0)
    b, _ = make(arch, seed=1)
    spec = mc.symmetry_spec(a, x)
    dense = mc.weight_matching(spec, a.state_dict(), b.state_dict(), seed=2)
    monkeypatch.setattr(lap_mod, "SPARSE_MIN_N", 1)  # every space by the sparse certified solver
    sparse = mc.weight_matching(spec, a.state_dict(), b.state_dict(), seed=2)
    assert sparse.stats["lap_sparse_calls"] == sparse.stats["lap_calls"] > 0
    assert sparse.objective == pytest.approx(dense.objective, rel=1e-6)
    assert len(sparse.history) == len(dense.history)
    for hs, hd in zip(sparse.history, dense.history, strict=True):
        assert hs == pytest.approx(hd, rel=1e-6)


@pytest.mark.usefixtures("small_k")
def test_fp32_scores_are_solved_without_an_fp64_copy_to_the_fp64_optimum():
    s32 = torch.from_numpy(_matrix("hubs", 120, np.random.default_rng(6))).float()
    s64 = s32.double().numpy()  # exact: the problem the dense solver sees
    timer = LapTimer()
    perm = solve_lap(s32, "P", timer, method="sparse")
    assert timer.dense_fallbacks == 0 and timer.certificate_failures >= 1
    assert _objective(s64, perm) == pytest.approx(_dense_optimum(s64), rel=1e-12)
    assert _objective(s64, solve_lap(s32, "P", method="dense")) == pytest.approx(_dense_optimum(s64), rel=1e-12)


@pytest.mark.parametrize("method", ["auto", "dense", "sparse"])
def test_empty_and_single_unit_spaces(method):
    assert solve_lap(torch.zeros(0, 0), "P", method=method).tolist() == []
    assert solve_lap(torch.ones(1, 1), "P", method=method).tolist() == [0]
