"""Linear assignment (LAP) via scipy, with the checks that keep NaN/Inf out of the solver."""

from __future__ import annotations

import time

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from ..errors import NonFiniteError


class LapTimer:
    """Accumulates the wall time (seconds) spent inside LAP solves."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0


def solve_lap(score: torch.Tensor, space: str, timer: LapTimer | None = None) -> torch.Tensor:
    """The permutation maximising ``Σ_i score[i, perm[i]]``.

    Args: ``score`` (n, n) similarity of unit i of A with unit j of B; ``space`` names the space in errors.
    Returns: LongTensor (n,) on the CPU — unit ``i`` of the aligned B is unit ``perm[i]`` of B.
    Raises: :class:`NonFiniteError` naming the space if ``score`` holds NaN or Inf (scipy would reject it
    with an unhelpful message, or worse, return garbage).
    """
    t = score.detach().to("cpu", torch.float64)
    s = t.numpy()
    # a finite sum means finite entries (NaN/Inf propagate); the entry-wise test (an n×n temporary) only on failure
    if not np.isfinite(s.sum()) and not np.isfinite(s).all():
        bad = int((~np.isfinite(s)).sum())
        raise NonFiniteError(f"cost matrix of space {space!r} ({s.shape[0]}×{s.shape[1]}) has {bad} NaN/Inf entries")
    start = time.perf_counter()
    # scipy's maximize=True negates a private copy of the whole matrix; negating in place solves the identical
    # problem without that n×n fp64 copy (512 MiB at n = 8192). The caller's fp64 matrix is restored exactly.
    np.negative(s, out=s)
    try:
        rows, cols = linear_sum_assignment(s)
    finally:
        if t.data_ptr() == score.data_ptr():
            np.negative(s, out=s)
    if timer is not None:
        timer.seconds += time.perf_counter() - start
        timer.calls += 1
    perm = np.empty(s.shape[0], dtype=np.int64)
    perm[rows] = cols
    return torch.from_numpy(perm)
