"""Continuous parameterisations of the symmetry groups, for learning group elements by gradient descent.

Dual learned matching (LMC-DM, METHODS.md §3) and its one-sided predecessor (Theus et al. 2025) learn the
continuous part of a group element — the global residual rotation, per-head QK/OV transforms, FFN
scalings — with Adam. Each space's element becomes the output of a small :class:`GroupTransform` module
whose unconstrained parameters Adam updates and whose ``forward()`` returns a valid element of the space's
group (:mod:`modeconn.symmetry.groups`) at every step.

*Trivialisation at the initial element.* Every transform is written relative to the element ``M₀`` it is
initialised at (weight matching's solution, or the identity): ``M(θ) = M₀ · Δ(θ)`` with ``Δ(0) = I`` exactly
(``s = s₀ ⊙ exp(u)`` for scalings). So initialisation is exact (``forward()`` at step 0 returns ``M₀``, equal
as values), and Adam moves in a chart centred on ``M₀`` (the "dynamic trivialisation" of Lezcano-Casado 2019,
which ``torch.nn.utils.parametrizations.orthogonal`` implements with its ``base``). Structured groups stay
structured because ``Δ`` has the same structure and the structure is closed under products.

Parameterisations (registry :data:`PARAMETERIZATIONS`; an unknown name raises ConfigError listing the valid
ones):

================ ======================================================================================
name             maps
================ ======================================================================================
``cayley``       orthogonal factors ``Q = Q₀·(I + A/2)(I − A/2)^{-1}``, ``A = X − Xᵀ`` (``X`` strictly
                 lower-triangular part of a free matrix) — the Cayley map ``(I − S)(I + S)^{-1}`` of
                 METHODS §3 with ``S = −A/2``; computed by ``torch.nn.utils.parametrizations.orthogonal(...,
                 orthogonal_map="cayley")`` with its trivialisation base set to ``Q₀``. **Default**.
``matrix_exp``   the same with ``Q = Q₀·exp(A)`` (``orthogonal_map="matrix_exp"``): the ablation.
``unconstrained`` free matrices, ``M = M₀ + Δ`` (``Δ`` keeps the rotary structure): the ablation. Iterates
                 of orthogonal groups are *not* orthogonal (so ``π(θ)`` does not compute ``θ``'s function
                 during training); :meth:`GroupTransform.element` projects to the nearest group element
                 (polar factor ``UVᵀ`` of the SVD; unit-norm rotary pairs). Invertible groups stay (generically)
                 invertible and function-preserving.
================ ======================================================================================

Per group (``M₀`` the initial element; shapes as in :mod:`modeconn.symmetry.groups`):

* ``orthogonal`` ``(n, n)``: ``Q = Q₀ · Qmap(X)``.
* ``invertible`` ``(n, n)``: the polar decomposition of the update, ``A = A₀ · Qmap(X) · P``, ``P = LLᵀ`` with ``L``
  lower-triangular, strictly-lower part free and diagonal ``exp(ℓ)`` (so ``P`` is symmetric positive definite
  and ``A`` invertible for every parameter value); ``X = ℓ = 0`` gives ``A = A₀``.
* ``scaling`` ``(n,)``: log-parameters, ``s = s₀ ⊙ exp(u)`` (always, whatever the parameterisation).
* ``head_orthogonal`` / ``head_invertible`` ``(H, d, d)`` with ``r`` rotary dims: ``C = C₀ · Δ``, ``Δ`` assembled
  per head from a scaled rotation ``e^{ρ}[[cos φ, −sin φ], [sin φ, cos φ]]`` per rotary pair (log-scale ``ρ``,
  angle ``φ``; ``ρ ≡ 0`` for ``head_orthogonal``) — exactly the matrices that commute with RoPE — and the
  batched ``(H, d−r, d−r)`` pass-through block, parameterised as ``orthogonal`` / ``invertible`` above.

``GroupTransform.element()`` is the detached element to hand to :meth:`SymmetrySpec.apply` (projected to the
group for ``unconstrained``); ``forward()`` is the differentiable one used inside the training loop. Parameters
and buffers live on the initial element's device in its dtype (fp32 or fp64).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.parametrizations import orthogonal as _torch_orthogonal

from ..errors import ConfigError, SpecError
from ..registry import Registry
from ..symmetry.groups import (
    Group,
    HeadInvertibleGroup,
    HeadOrthogonalGroup,
    InvertibleGroup,
    OrthogonalGroup,
    ScalingGroup,
)


@dataclass(frozen=True)
class Parameterization:
    """A named way to parameterise continuous group elements.

    ``orthogonal_map``: the map of ``torch.nn.utils.parametrizations.orthogonal`` used for orthogonal factors
    (``"cayley"`` or ``"matrix_exp"``), or ``None`` for free (``unconstrained``) matrices.
    ``exact``: every iterate is a group element (False for ``unconstrained`` on orthogonal groups).
    """

    name: str
    orthogonal_map: str | None
    summary: str

    @property
    def exact(self) -> bool:
        return self.orthogonal_map is not None


PARAMETERIZATIONS: Registry[Parameterization] = Registry("parameterization")
for _p in (
    Parameterization("cayley", "cayley", "Cayley map for orthogonal factors, polar (Cayley · Cholesky) for invertible"),
    Parameterization("matrix_exp", "matrix_exp", "matrix exponential for orthogonal factors, polar for invertible"),
    Parameterization("unconstrained", None, "free matrices M₀ + Δ; orthogonal results projected (polar factor)"),
):
    PARAMETERIZATIONS.register(_p.name)(_p)


def get_parameterization(name: str | Parameterization) -> Parameterization:
    """The registered parameterisation ``name`` (ConfigError naming the option and the valid names)."""
    if isinstance(name, Parameterization):
        return name
    if not isinstance(name, str) or name not in PARAMETERIZATIONS:
        raise ConfigError(
            f"unknown parameterization {name!r}; valid parameterizations: {', '.join(PARAMETERIZATIONS.names())}"
        )
    return PARAMETERIZATIONS.get(name)


# ------------------------------------------------------------------------------------------ building blocks
def _eye(batch: tuple[int, ...], n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.eye(n, dtype=like.dtype, device=like.device).expand(*batch, n, n).clone()


def polar_factor(m: torch.Tensor) -> torch.Tensor:
    """The nearest orthogonal matrices (Frobenius norm) to ``m`` (…, n, n): ``UVᵀ`` of the SVD, in fp64, returned
    in ``m``'s dtype."""
    if m.numel() == 0:
        return m.clone()
    u, _, vh = torch.linalg.svd(m.detach().double())
    return (u @ vh).to(m.dtype)


class _OrthogonalFactor(nn.Module):
    """Orthogonal matrices ``(*batch, n, n)``: ``Q = base · Qmap(X)`` (torch's orthogonal parametrisation with
    its trivialisation base set to ``base`` exactly), or ``base + Δ`` when ``orthogonal_map`` is None."""

    def __init__(self, base: torch.Tensor, orthogonal_map: str | None) -> None:
        super().__init__()
        self.orthogonal_map = orthogonal_map
        self.empty = base.shape[-1] == 0
        if self.empty:
            self.register_buffer("base", base.detach().clone())
            return
        if orthogonal_map is None:
            self.register_buffer("base", base.detach().clone())
            self.delta = nn.Parameter(torch.zeros_like(base))
            return
        holder = nn.Module()
        holder.weight = nn.Parameter(base.detach().clone())
        _torch_orthogonal(holder, "weight", orthogonal_map=orthogonal_map)
        # torch re-orthogonalises (QR) a base that is not orthogonal to ~10·n·eps; keep the given one exactly
        holder.parametrizations.weight[0].base = base.detach().clone()
        self.holder = holder

    def forward(self) -> torch.Tensor:
        if self.empty:
            return self.base
        if self.orthogonal_map is None:
            return self.base + self.delta
        return self.holder.weight


class _SPDFactor(nn.Module):
    """Symmetric positive definite matrices ``P = LLᵀ`` (``*batch, n, n``): ``L`` lower-triangular with free strict
    lower part and diagonal ``exp(ℓ)``; all zeros give ``P = I`` exactly."""

    def __init__(self, like: torch.Tensor) -> None:
        super().__init__()
        self.lower = nn.Parameter(torch.zeros_like(like))
        self.log_diag = nn.Parameter(torch.zeros(like.shape[:-1], dtype=like.dtype, device=like.device))

    def forward(self) -> torch.Tensor:
        chol = torch.tril(self.lower, diagonal=-1) + torch.diag_embed(torch.exp(self.log_diag))
        return chol @ chol.transpose(-1, -2)


class _InvertibleFactor(nn.Module):
    """Invertible matrices (``*batch, n, n``) relative to ``base``: polar ``base · Q · P`` or free ``base + Δ``."""

    def __init__(self, base: torch.Tensor, orthogonal_map: str | None) -> None:
        super().__init__()
        self.register_buffer("base", base.detach().clone())
        self.polar = orthogonal_map is not None and base.shape[-1] > 0
        if self.polar:
            eye = _eye(tuple(base.shape[:-2]), base.shape[-1], base)
            self.q = _OrthogonalFactor(eye, orthogonal_map)
            self.p = _SPDFactor(eye)
        elif base.shape[-1] > 0:
            self.delta = nn.Parameter(torch.zeros_like(base))

    def forward(self) -> torch.Tensor:
        if self.polar:
            return self.base @ (self.q() @ self.p())
        if self.base.shape[-1] == 0:
            return self.base
        return self.base + self.delta


# ------------------------------------------------------------------------------------------ group transforms
class GroupTransform(nn.Module):
    """A learnable element of one space's group; ``forward()`` → the element tensor (differentiable).

    Build with :func:`make_transform`. Attributes: ``group`` (the :class:`~modeconn.symmetry.groups.Group`),
    ``parameterization`` (:class:`Parameterization`), ``size`` (the space size ``n``).
    """

    group: Group

    def __init__(self, group: Group, size: int, parameterization: Parameterization) -> None:
        super().__init__()
        self.group, self.size, self.parameterization = group, size, parameterization

    def element(self) -> torch.Tensor:
        """The current element, detached and projected onto the group (a no-op for exact parameterisations)."""
        with torch.no_grad():
            return self.project(self().detach()).clone()

    def project(self, m: torch.Tensor) -> torch.Tensor:
        return m


class OrthogonalTransform(GroupTransform):
    """``orthogonal`` (n, n): ``Q = Q₀ · Qmap(X)`` (Cayley or matrix exponential), or ``Q₀ + Δ`` projected."""

    def __init__(self, group, element, parameterization):
        super().__init__(group, element.shape[0], parameterization)
        self.q = _OrthogonalFactor(element, parameterization.orthogonal_map)

    def forward(self):
        return self.q()

    def project(self, m):
        return m if self.parameterization.exact else polar_factor(m)


class InvertibleTransform(GroupTransform):
    """``invertible`` (n, n): the polar decomposition ``A = A₀ · Q · LLᵀ`` of the update, or ``A₀ + Δ``."""

    def __init__(self, group, element, parameterization):
        super().__init__(group, element.shape[0], parameterization)
        self.a = _InvertibleFactor(element, parameterization.orthogonal_map)

    def forward(self):
        return self.a()


class ScalingTransform(GroupTransform):
    """``scaling`` (n,): ``s = s₀ ⊙ exp(u)`` (log-parameters; positive for every ``u``)."""

    def __init__(self, group, element, parameterization):
        super().__init__(group, element.shape[0], parameterization)
        self.register_buffer("base", element.detach().clone())
        self.log_scale = nn.Parameter(torch.zeros_like(element))

    def forward(self):
        return self.base * torch.exp(self.log_scale)


class HeadTransform(GroupTransform):
    """``head_orthogonal`` / ``head_invertible`` (H, d, d): ``C = C₀ · Δ``, ``Δ`` per head a scaled rotation per
    rotary pair (log-scale, angle) and an orthogonal / polar-invertible pass-through block; ``unconstrained``:
    ``C = C₀ + Δ`` with ``Δ`` of the same structure (pairs ``[[a, −b], [b, a]]`` free)."""

    def __init__(self, group, element, parameterization):
        super().__init__(group, element.shape[0], parameterization)
        h, r, d = element.shape[0], group.rotary_dims, group.dim
        self.invertible = isinstance(group, HeadInvertibleGroup)
        self.register_buffer("base", element.detach().clone())
        zeros_pairs = torch.zeros(h, r // 2, dtype=element.dtype, device=element.device)
        eye_rest = _eye((h,), d - r, element)
        if parameterization.exact:
            self.angle = nn.Parameter(zeros_pairs.clone())
            if self.invertible:
                self.log_scale = nn.Parameter(zeros_pairs.clone())
            factor = _InvertibleFactor if self.invertible else _OrthogonalFactor
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


def make_transform(group: Group, element: torch.Tensor, parameterization: str | Parameterization = "cayley") -> GroupTransform:
    """A :class:`GroupTransform` for ``group`` initialised exactly at ``element`` (``forward()`` returns values equal to
    ``element`` before any update).

    Args:
        group: a continuous group instance (``spec.group_of(space)``): orthogonal, invertible, scaling,
            head_orthogonal or head_invertible.
        element: its initial element (float tensor of the group's element shape; validated with ``group.check``).
        parameterization: a name in :data:`PARAMETERIZATIONS` (default ``"cayley"``).
    Raises: ConfigError (unknown parameterisation), SpecError (a discrete or unknown group, an invalid element).
    """
    par = get_parameterization(parameterization)
    if isinstance(group, InvertibleGroup):  # before OrthogonalGroup: InvertibleGroup subclasses it
        cls = InvertibleTransform
    elif isinstance(group, OrthogonalGroup):
        cls = OrthogonalTransform
    elif isinstance(group, ScalingGroup):
        cls = ScalingTransform
    elif isinstance(group, (HeadOrthogonalGroup, HeadInvertibleGroup)):
        cls = HeadTransform
    else:
        raise SpecError(
            f"group {getattr(group, 'name', group)!r} has no continuous parameterisation (discrete groups are matched, "
            "not learned, by dual matching)"
        )
    n = element.shape[0] if isinstance(element, torch.Tensor) and element.dim() else 0
    group.check(element, n, f"<initial {group.name} element>")
    return cls(group, element.detach(), par)
