"""``invertible``: GL(n) on a whole space, with its weight-matching solver (best of the least-squares surrogate,
Procrustes and scaled Procrustes) and its learned parameterisation (polar: orthogonal · SPD)."""

from __future__ import annotations

import torch

from .base import GROUPS, ContinuousGroup, check_invertible, float_element, matrix_compose, matrix_identity, well_conditioned
from .learning import GroupTransform, InvertibleFactor
from .solving import CandidateSolver, procrustes, ridge, sylvester


class InvertibleTransform(GroupTransform):
    """``invertible`` (n, n): the polar decomposition ``A = A₀ · Q · LLᵀ`` of the update, or ``A₀ + Δ``."""

    def __init__(self, group, element, parameterization):
        super().__init__(group, element.shape[0], parameterization)
        self.a = InvertibleFactor(element, parameterization.orthogonal_map)

    def forward(self):
        return self.a()


def least_squares(group, st, k: torch.Tensor) -> torch.Tensor:
    """The minimiser of the surrogate ``S`` over GL(n): the Sylvester solution ``P M + M Q_out + ε M = K + ε I``."""
    return sylvester(st.xx_in, st.yy_out, k, ridge(st))


@GROUPS.register("invertible")
class InvertibleGroup(ContinuousGroup):
    """GL(n): an element is an invertible ``(n, n)`` matrix ``A``; writers transform by ``A``, readers by
    ``A^{-T}`` (computed once per ``spec.apply`` call, in fp64). Random: ``Q·P``, ``Q`` Haar, ``P`` SPD with
    eigenvalues in [1/2, 2] (condition number ≤ 4) — the polar decomposition of METHODS §3.

    Weight matching: :class:`~.solving.CandidateSolver` (never worse than orthogonal alignment). Learned:
    :class:`InvertibleTransform`."""

    name = "invertible"
    isometric = False
    solver = CandidateSolver(least_squares, lambda group, k: procrustes(k))
    transform = InvertibleTransform

    def identity(self, n):
        return matrix_identity(n)

    def random(self, n, generator):
        return well_conditioned(generator, (), n).to(torch.float32)

    def compose(self, g, h):
        return matrix_compose(g, h)

    def inverse(self, g):
        return torch.linalg.inv(g.double()).to(g.dtype)

    def check(self, g, n, space):
        check_invertible(float_element(g, (n, n), space, "an invertible"), space, "an invertible")

    def _side_matrix(self, g, side):
        return g.double() if side == "out" else torch.linalg.inv(g.double()).transpose(-1, -2)

    def _apply(self, x, m, n):
        return m @ x
