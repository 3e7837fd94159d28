"""The LAP policy (issue #38): whatever :data:`~modeconn.match.lap.LAP_POLICIES` picks, and the row-maxima exit in
front of it, answers scipy's optimum — on a fuzz set of random sizes, integer scores full of ties, float scores, flat
and planted (permuted-copy) scores. Square scores only: :func:`~modeconn.match.lap.solve_lap` takes (n, n)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from modeconn.match import lap as lap_mod
from modeconn.match.lap import LapTimer, lap_method, solve_lap


def _optimum(s: np.ndarray) -> float:
    rows, cols = linear_sum_assignment(s, maximize=True)
    return float(s[rows, cols].sum())


def _case(rng: np.random.Generator, kind: str, n: int) -> np.ndarray:
    if kind == "int-ties":  # few distinct values: many optimal permutations
        return rng.integers(-3, 4, size=(n, n)).astype(np.float64)
    if kind == "int-wide":
        return rng.integers(-10**6, 10**6, size=(n, n)).astype(np.float64)
    if kind == "float":
        return rng.standard_normal((n, n))
    if kind == "fp32":
        return rng.standard_normal((n, n)).astype(np.float32)
    if kind == "degenerate":  # all equal, rank one, one dominant entry, or huge with tiny differences
        pick = int(rng.integers(4))
        if pick == 0:
            return np.full((n, n), 2.5)
        if pick == 1:
            return np.outer(rng.standard_normal(n), rng.standard_normal(n))
        if pick == 2:
            s = np.zeros((n, n))
            s[rng.integers(n), rng.integers(n)] = 1e12
            return s
        return 1e9 + rng.integers(0, 3, size=(n, n)).astype(np.float64)
    a = rng.standard_normal((n, 8))  # "planted": B a permuted, perturbed copy of A
    noise = {"planted": 0.05, "planted-weak": 1.0}[kind]
    return a @ (a + noise * rng.standard_normal((n, 8)))[rng.permutation(n)].T


KINDS = ("int-ties", "int-wide", "float", "fp32", "planted", "planted-weak", "degenerate")


@pytest.mark.parametrize("method", ["auto", "dense", "sparse"])
@pytest.mark.parametrize("kind", KINDS)
def test_policy_answers_scipys_optimum_on_a_fuzz_set(kind, method, monkeypatch):
    monkeypatch.setattr(lap_mod, "SPARSE_MIN_N", 16)  # "auto" takes both branches on small sizes
    rng = np.random.default_rng(zlib.crc32(f"{kind}/{method}".encode()))
    for n in [1, 2, 3, *rng.integers(4, 80, size=12).tolist(), 257]:
        s = _case(rng, kind, n)
        perm = solve_lap(torch.from_numpy(s), "fuzz", method=method).numpy()
        assert sorted(perm.tolist()) == list(range(n))
        got, best = float(s.astype(np.float64)[np.arange(n), perm].sum()), _optimum(s.astype(np.float64))
        if kind.startswith("int") or kind == "degenerate":
            assert got == best, (kind, n)
        else:
            assert got == pytest.approx(best, rel=1e-12, abs=1e-9), (kind, n)


@pytest.mark.parametrize("device", ["cpu", "cuda", "mps", "xpu"])
def test_every_device_policy_chooses_a_method_solve_lap_takes(device):
    for n in (2, 512, 2048, 16384):
        for batch in (1, 32):
            assert lap_method(device, n, batch) in ("auto", "dense", "sparse")


def test_row_maxima_answer_a_permuted_copy_without_a_solver():
    rng = np.random.default_rng(0)
    n = 300
    a = rng.standard_normal((n, 32))
    planted = rng.permutation(n)
    s = torch.from_numpy(a @ a[planted].T)  # row i's maximum is at the column holding unit i: planted⁻¹
    timer = LapTimer()
    perm = solve_lap(s, "planted", timer, method="sparse")
    assert torch.equal(perm, torch.from_numpy(np.argsort(planted)))
    assert timer.calls == 1 and timer.sparse_calls == 0  # no solver ran


def test_row_maxima_do_not_answer_when_two_rows_share_a_column():
    """Negative control: rows 0 and 1 both peak at column 0; the exit must leave it to the solver, whose optimum
    gives column 0 to row 1 (9 + 9 + 1 = 19 beats 10 + 0 + 1 = 11 with row 0 keeping its maximum)."""
    s = torch.tensor([[10.0, 9.0, 0.0], [9.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    assert lap_mod._row_maxima(s) is None
    perm = solve_lap(s, "collide")
    assert perm.tolist() == [1, 0, 2]
