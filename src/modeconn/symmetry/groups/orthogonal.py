"""``orthogonal``: O(n) on a whole space (the global residual rotation), with its weight-matching solver
(orthogonal Procrustes) and its learned parameterisation (Cayley / matrix exponential, or free + polar factor)."""

from __future__ import annotations

import torch

from .base import GROUPS, ContinuousGroup, check_orthogonal, float_element, haar, matrix_compose, matrix_identity
from .learning import GroupTransform, OrthogonalFactor, polar_factor
from .solving import IsometricSolver, procrustes


class OrthogonalTransform(GroupTransform):
    """``orthogonal`` (n, n): ``Q = Q₀ · Qmap(X)`` (Cayley or matrix exponential), or ``Q₀ + Δ`` projected."""

    def __init__(self, group, element, parameterization):
        super().__init__(group, element.shape[0], parameterization)
        self.q = OrthogonalFactor(element, parameterization.orthogonal_map)

    def forward(self):
        return self.q()

    def project(self, m):
        return m if self.parameterization.exact else polar_factor(m)


@GROUPS.register("orthogonal")
class OrthogonalGroup(ContinuousGroup):
    """O(n): an element is an orthogonal ``(n, n)`` matrix ``Q``; ``M_g = Q`` on units (``Q ⊗ I_block`` on
    the entries). Both sides transform by ``Q`` (``Q^{-T} = Q``). Random: Haar (QR of a Gaussian, sign fix).
    Used for the global residual rotation once every LayerNorm is an RMSNorm without weight (METHODS §0).

    Weight matching: Procrustes on ``K = K_out + K_in`` (exact). Learned: :class:`OrthogonalTransform`."""

    name = "orthogonal"
    solver = IsometricSolver(lambda group, k: procrustes(k))
    transform = OrthogonalTransform

    def identity(self, n):
        return matrix_identity(n)

    def random(self, n, generator):
        return haar(generator, n, n).to(torch.float32)

    def compose(self, g, h):
        return matrix_compose(g, h)

    def inverse(self, g):
        return g.transpose(0, 1).clone()

    def check(self, g, n, space):
        check_orthogonal(float_element(g, (n, n), space, "an orthogonal"), space, "an orthogonal")

    def _side_matrix(self, g, side):
        return g.double()

    def _apply(self, x, m, n):
        return m @ x
