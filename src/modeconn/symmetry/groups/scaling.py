"""``scaling``: positive per-unit scalings, with their weight-matching solver (surrogate or 1, refined by Newton on
the exact 1-D cost) and their learned parameterisation (log-scales)."""

from __future__ import annotations

import torch
from torch import nn

from ...errors import SpecError
from .base import GROUPS, ContinuousGroup, float_element, log_uniform
from .learning import GroupTransform
from .solving import SCALE_RANGE, Solver, best_scale, ridge


class ScalingTransform(GroupTransform):
    """``scaling`` (n,): ``s = s₀ ⊙ exp(u)`` (log-parameters; positive for every ``u``)."""

    def __init__(self, group, element, parameterization):
        super().__init__(group, element.shape[0], parameterization)
        self.register_buffer("base", element.detach().clone())
        self.log_scale = nn.Parameter(torch.zeros_like(element))

    def forward(self):
        return self.base * torch.exp(self.log_scale)


class ScalingSolver(Solver):
    """One positive scalar per unit (``d = 1``): the better (by exact ``D``) of the surrogate solution
    ``s = (K + ε)/(P + Q_out + ε)`` (clamped to ``[1e-4, 1e4]``) and ``s = 1``, refined on the exact per-unit ``D``
    by :func:`~.solving.best_scale`."""

    def solve(self, group, st):
        k = st.k_out + st.k_in
        eps = ridge(st)
        ls = ((k + eps) / (st.xx_in + st.yy_out + eps)).clamp(*SCALE_RANGE)
        qo, ko, qi, ki = st.yy_out, st.k_out, st.yy_in, st.k_in
        one = torch.ones_like(ls[..., 0, 0])
        start = torch.where(self.cost(group, ls, st) < self.cost(group, torch.ones_like(ls), st), ls[..., 0, 0], one)
        qo, ko, qi, ki = (torch.broadcast_to(x, ls.shape)[..., 0, 0] for x in (qo, ko, qi, ki))
        m = best_scale(start, qo, ko, qi, ki)[..., None, None]
        return m, self.cost(group, m, st)


@GROUPS.register("scaling")
class ScalingGroup(ContinuousGroup):
    """Positive diagonal scalings (R_{>0})^n: an element is a vector ``s`` of ``n`` positive scales; writers
    multiply unit ``i`` by ``s[i]``, readers divide by it. Valid where the activation is positively
    homogeneous (ReLU units, the linear branch of a GLU) or, without normalisation, on a residual stream.
    Random: log-uniform in [1/2, 2].

    Weight matching: :class:`ScalingSolver`. Learned: :class:`ScalingTransform` (whatever the parameterisation)."""

    name = "scaling"
    isometric = False
    unitwise = True
    solver = ScalingSolver()
    transform = ScalingTransform

    def identity(self, n):
        return torch.ones(n)

    def random(self, n, generator):
        return log_uniform(generator, n).to(torch.float32)

    def compose(self, g, h):
        return (g.double() * h.to(g.device).double()).to(g.dtype)

    def inverse(self, g):
        return (1.0 / g.double()).to(g.dtype)

    def check(self, g, n, space):
        v = float_element(g, (n,), space, "a scaling")
        bad = (v <= 0).nonzero()
        if len(bad):
            i = int(bad[0])
            raise SpecError(f"space {space!r}: non-positive scale {float(v[i]):.3g} at unit {i} (scales must be > 0)")

    def permute_units(self, g, perm):
        return g[perm.to(g.device)]

    def _side_matrix(self, g, side):
        return g.double() if side == "out" else 1.0 / g.double()

    def _apply(self, x, m, n):
        return x * m[:, None]
