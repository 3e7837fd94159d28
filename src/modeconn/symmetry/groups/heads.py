"""``head_orthogonal`` / ``head_invertible``: one ``d × d`` transform per attention head (the children of a head
permutation), optionally restricted to matrices that commute with rotary embeddings, with their weight-matching
solvers (rotary-structured Procrustes; best of surrogate / rotations / scaled rotations) and their learned
parameterisation (scaled rotation per rotary pair × orthogonal / polar pass-through block)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ...errors import SpecError
from .base import (
    GROUPS,
    STRUCTURE_TOL,
    ContinuousGroup,
    check_invertible,
    check_orthogonal,
    float_element,
    haar,
    log_uniform,
    well_conditioned,
)
from .learning import GroupTransform, InvertibleFactor, OrthogonalFactor, eye_like, polar_factor
from .solving import CandidateSolver, IsometricSolver, procrustes, ridge, sylvester


# ---------------------------------------------------------------------------------------------- learned
class HeadTransform(GroupTransform):
    """``head_orthogonal`` / ``head_invertible`` (H, d, d): ``C = C₀ · Δ``, ``Δ`` per head a scaled rotation per
    rotary pair (log-scale, angle) and an orthogonal / polar-invertible pass-through block; ``unconstrained``:
    ``C = C₀ + Δ`` with ``Δ`` of the same structure (pairs ``[[a, −b], [b, a]]`` free)."""

    def __init__(self, group, element, parameterization):
        super().__init__(group, element.shape[0], parameterization)
        h, r, d = element.shape[0], group.rotary_dims, group.dim
        self.invertible = not group.isometric
        self.register_buffer("base", element.detach().clone())
        zeros_pairs = torch.zeros(h, r // 2, dtype=element.dtype, device=element.device)
        eye_rest = eye_like((h,), d - r, element)
        if parameterization.exact:
            self.angle = nn.Parameter(zeros_pairs.clone())
            if self.invertible:
                self.log_scale = nn.Parameter(zeros_pairs.clone())
            factor = InvertibleFactor if self.invertible else OrthogonalFactor
            self.rest = factor(eye_rest, parameterization.orthogonal_map)
        else:
            self.pair_a = nn.Parameter(zeros_pairs.clone())
            self.pair_b = nn.Parameter(zeros_pairs.clone())
            self.rest_delta = nn.Parameter(torch.zeros_like(eye_rest))

    def forward(self):
        group = self.group
        if not self.parameterization.exact:
            return self.base + group.assemble(self.pair_a, self.pair_b, self.rest_delta)
        a, b = torch.cos(self.angle), torch.sin(self.angle)
        if self.invertible:
            scale = torch.exp(self.log_scale)
            a, b = scale * a, scale * b
        return self.base @ group.assemble(a, b, self.rest())

    def project(self, m):
        if self.parameterization.exact or self.invertible:
            return m
        group, r = self.group, self.group.rotary_dims
        p, q = group.pairs
        a, b = m[..., p, p], m[..., q, p]
        norm = torch.sqrt(a * a + b * b).clamp_min(torch.finfo(m.dtype).tiny)
        return group.assemble(a / norm, b / norm, polar_factor(m[..., r:, r:]))


# ---------------------------------------------------------------------------------------------- solvers
def _pair_coefficients(group, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(K_pp + K_qq, K_qp − K_pq)`` on every rotary pair ``(p, q)``."""
    p, q = group.pairs
    return k[..., p, p] + k[..., q, q], k[..., q, p] - k[..., p, q]


def rotary_procrustes(group, k: torch.Tensor) -> torch.Tensor:
    """argmax of ``⟨M, K⟩`` over rotations on the rotary pairs × O(d−r): on each pair ``(cos φ, sin φ) ∝
    (K_pp + K_qq, K_qp − K_pq)`` (the identity where both vanish); Procrustes on the pass-through block.
    Plain Procrustes without rotary dims."""
    rot = group.rotary_dims
    if not rot:
        return procrustes(k)
    k1, k2 = _pair_coefficients(group, k)
    norm = torch.sqrt(k1 * k1 + k2 * k2)
    zero = norm == 0
    safe = torch.where(zero, torch.ones_like(norm), norm)
    a = torch.where(zero, torch.ones_like(k1), k1 / safe)
    b = torch.where(zero, torch.zeros_like(k2), k2 / safe)
    return group.assemble(a, b, procrustes(k[..., rot:, rot:]))


def rotary_least_squares(group, st, k: torch.Tensor) -> torch.Tensor:
    """The minimiser of the surrogate ``S`` over RoPE-commuting matrices: block-diagonal ``M`` makes ``S``
    separate; each rotary pair's scaled rotation ``aI + bJ`` is ``(a, b) = (k₁ + 2ε, k₂)/(tr P_pair + tr Q_pair +
    2ε)``; a Sylvester solve on the pass-through block (the whole matrix without rotary dims)."""
    eps = ridge(st)
    rot = group.rotary_dims
    if not rot:
        return sylvester(st.xx_in, st.yy_out, k, eps)
    p, q = group.pairs
    k1, k2 = _pair_coefficients(group, k)
    tr = st.xx_in[..., p, p] + st.xx_in[..., q, q] + st.yy_out[..., p, p] + st.yy_out[..., q, q]
    a, b = torch.broadcast_tensors((k1 + 2 * eps) / (tr + 2 * eps), k2 / (tr + 2 * eps))
    rest = sylvester(st.xx_in[..., rot:, rot:], st.yy_out[..., rot:, rot:], k[..., rot:, rot:], eps)
    return group.assemble(a, b, rest)


# ---------------------------------------------------------------------------------------------- groups
class HeadGroupBase(ContinuousGroup):
    """One ``d × d`` transform per head; see :mod:`modeconn.symmetry.groups` for the rotary restriction."""

    unitwise = True
    per_head = True

    def __init__(self, dim: int, rotary_dims: int = 0, rotary_pairing: str = "half") -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise SpecError(f"{self.name}: dim (the head dimension) must be a positive int, got {dim!r}")
        if isinstance(rotary_dims, bool) or not isinstance(rotary_dims, int) or not 0 <= rotary_dims <= dim or rotary_dims % 2:
            raise SpecError(f"{self.name}: rotary_dims must be an even int in [0, dim={dim}], got {rotary_dims!r}")
        if rotary_pairing not in ("half", "interleaved"):
            raise SpecError(f"{self.name}: rotary_pairing must be 'half' or 'interleaved', got {rotary_pairing!r}")
        self.dim, self.rotary_dims, self.rotary_pairing = dim, rotary_dims, rotary_pairing
        r = rotary_dims
        if rotary_pairing == "half":
            p, q = torch.arange(r // 2), torch.arange(r // 2) + r // 2
        else:
            p, q = torch.arange(0, r, 2), torch.arange(1, r, 2)
        self.pairs = (p, q)
        self.rest = torch.arange(r, dim)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim}, rotary_dims={self.rotary_dims}, rotary_pairing={self.rotary_pairing!r})"

    # -- structure
    def project(self, m: torch.Tensor) -> torch.Tensor:
        """The nearest (in the entry-wise least-squares sense) RoPE-commuting matrices: pair blocks averaged
        to ``[[a, -b], [b, a]]``, every other entry outside the pass-through block zeroed. Identity map when
        ``rotary_dims = 0``."""
        if not self.rotary_dims:
            return m
        p, q = self.pairs
        a = (m[..., p, p] + m[..., q, q]) / 2
        b = (m[..., q, p] - m[..., p, q]) / 2
        out = torch.zeros_like(m)
        out[..., p, p], out[..., q, q], out[..., q, p], out[..., p, q] = a, a, b, -b
        r = self.rotary_dims
        out[..., r:, r:] = m[..., r:, r:]
        return out

    def assemble(self, a: torch.Tensor, b: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
        """Matrices (…, d, d) from pair coefficients ``a, b`` (…, r/2) and the pass-through block (…, d−r, d−r)."""
        shape = rest.shape[:-2] if rest.dim() >= 2 else a.shape[:-1]
        out = torch.zeros(*shape, self.dim, self.dim, dtype=rest.dtype, device=rest.device)
        p, q = self.pairs
        out[..., p, p], out[..., q, q], out[..., q, p], out[..., p, q] = a, a, b, -b
        out[..., self.rotary_dims:, self.rotary_dims:] = rest
        return out

    # -- group
    def identity(self, n):
        return torch.eye(self.dim).expand(n, self.dim, self.dim).clone()

    def compose(self, g, h):
        return self.project(g.double() @ h.to(g.device).double()).to(g.dtype)

    def permute_units(self, g, perm):
        return g[perm.to(g.device)]

    def _shape_check(self, g, n, space) -> torch.Tensor:
        m = float_element(g, (n, self.dim, self.dim), space, f"a {self.name} (dim={self.dim})")
        if self.rotary_dims:
            dev = (m - self.project(m)).abs().amax(dim=(-1, -2))
            tol = STRUCTURE_TOL * max(1.0, float(m.abs().max()))
            bad = (dev > tol).nonzero()
            if len(bad):
                h = int(bad[0])
                raise SpecError(
                    f"space {space!r}: head {h} transform does not commute with the rotary embedding "
                    f"(rotary_dims={self.rotary_dims}, pairing {self.rotary_pairing!r}; deviation {float(dev[h]):.3g})"
                )
        return m

    def _apply(self, x, m, n):
        return (m @ x.reshape(n, self.dim, -1)).reshape(n, -1)


@GROUPS.register("head_orthogonal")
class HeadOrthogonalGroup(HeadGroupBase):
    """O(d)^n, one orthogonal ``d × d`` matrix per head (``rotary_dims``: rotations ``[[c, -s], [s, c]]`` on
    each rotary pair, ``O(d−r)`` on the rest). Element ``(n, d, d)``; both sides transform by ``C[i]``.

    Weight matching: :func:`rotary_procrustes` (exact). Learned: :class:`HeadTransform`."""

    name = "head_orthogonal"
    solver = IsometricSolver(rotary_procrustes)
    transform = HeadTransform

    def random(self, n, generator):
        r = self.rotary_dims
        phi = 2 * math.pi * torch.rand(n, r // 2, generator=generator, dtype=torch.float64)
        rest = haar(generator, n, self.dim - r, self.dim - r)
        return self.assemble(torch.cos(phi), torch.sin(phi), rest).to(torch.float32)

    def inverse(self, g):
        return g.transpose(-1, -2).clone()

    def check(self, g, n, space):
        check_orthogonal(self._shape_check(g, n, space), space, f"a {self.name}")

    def _side_matrix(self, g, side):
        return g.double()


@GROUPS.register("head_invertible")
class HeadInvertibleGroup(HeadGroupBase):
    """GL(d)^n, one invertible ``d × d`` matrix per head (``rotary_dims``: scaled rotations on each rotary pair,
    ``GL(d−r)`` on the rest). Element ``(n, d, d)``; writers transform by ``C[i]``, readers by
    ``C[i]^{-T}``. Random: scaled rotations with scale in [1/2, 2] and uniform angle; ``Q·P`` blocks
    (condition number ≤ 4) elsewhere.

    Weight matching: :class:`~.solving.CandidateSolver` with the rotary-structured surrogate and rotations.
    Learned: :class:`HeadTransform`."""

    name = "head_invertible"
    isometric = False
    solver = CandidateSolver(rotary_least_squares, rotary_procrustes)
    transform = HeadTransform

    def random(self, n, generator):
        r = self.rotary_dims
        rho = log_uniform(generator, n, r // 2)
        phi = 2 * math.pi * torch.rand(n, r // 2, generator=generator, dtype=torch.float64)
        rest = well_conditioned(generator, (n,), self.dim - r)
        return self.assemble(rho * torch.cos(phi), rho * torch.sin(phi), rest).to(torch.float32)

    def inverse(self, g):
        return self.project(torch.linalg.inv(g.double())).to(g.dtype)

    def check(self, g, n, space):
        check_invertible(self._shape_check(g, n, space), space, f"a {self.name}")

    def _side_matrix(self, g, side):
        return g.double() if side == "out" else self.project(torch.linalg.inv(g.double())).transpose(-1, -2)
