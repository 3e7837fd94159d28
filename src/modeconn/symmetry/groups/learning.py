"""Learned parameterisations: the interface a group's ``transform`` hook implements, and the building blocks the
groups share (see :mod:`modeconn.match.parametrize` for the maths and the user-facing :func:`make_transform`).

A group's ``transform`` is a :class:`GroupTransform` subclass, built as ``cls(group, element, parameterization)``
with a validated initial ``element`` and a :class:`Parameterization` (``cayley``, ``matrix_exp``,
``unconstrained``); ``forward()`` returns a valid element (differentiable), ``element()`` the detached one
projected onto the group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn.utils.parametrizations import orthogonal as _torch_orthogonal

from ...errors import ConfigError
from ...registry import Registry

if TYPE_CHECKING:
    from .base import Group


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
def eye_like(batch: tuple[int, ...], n: int, like: torch.Tensor) -> torch.Tensor:
    """A stack ``(*batch, n, n)`` of identities in ``like``'s dtype and device (a new tensor)."""
    return torch.eye(n, dtype=like.dtype, device=like.device).expand(*batch, n, n).clone()


def polar_factor(m: torch.Tensor) -> torch.Tensor:
    """The nearest orthogonal matrices (Frobenius norm) to ``m`` (…, n, n): ``UVᵀ`` of the SVD, in fp64, returned
    in ``m``'s dtype."""
    if m.numel() == 0:
        return m.clone()
    u, _, vh = torch.linalg.svd(m.detach().double())
    return (u @ vh).to(m.dtype)


class OrthogonalFactor(nn.Module):
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


class SPDFactor(nn.Module):
    """Symmetric positive definite matrices ``P = LLᵀ`` (``*batch, n, n``): ``L`` lower-triangular with free strict
    lower part and diagonal ``exp(ℓ)``; all zeros give ``P = I`` exactly."""

    def __init__(self, like: torch.Tensor) -> None:
        super().__init__()
        self.lower = nn.Parameter(torch.zeros_like(like))
        self.log_diag = nn.Parameter(torch.zeros(like.shape[:-1], dtype=like.dtype, device=like.device))

    def forward(self) -> torch.Tensor:
        chol = torch.tril(self.lower, diagonal=-1) + torch.diag_embed(torch.exp(self.log_diag))
        return chol @ chol.transpose(-1, -2)


class InvertibleFactor(nn.Module):
    """Invertible matrices (``*batch, n, n``) relative to ``base``: polar ``base · Q · P`` or free ``base + Δ``."""

    def __init__(self, base: torch.Tensor, orthogonal_map: str | None) -> None:
        super().__init__()
        self.register_buffer("base", base.detach().clone())
        self.polar = orthogonal_map is not None and base.shape[-1] > 0
        if self.polar:
            eye = eye_like(tuple(base.shape[:-2]), base.shape[-1], base)
            self.q = OrthogonalFactor(eye, orthogonal_map)
            self.p = SPDFactor(eye)
        elif base.shape[-1] > 0:
            self.delta = nn.Parameter(torch.zeros_like(base))

    def forward(self) -> torch.Tensor:
        if self.polar:
            return self.base @ (self.q() @ self.p())
        if self.base.shape[-1] == 0:
            return self.base
        return self.base + self.delta


class GroupTransform(nn.Module):
    """A learnable element of one space's group; ``forward()`` → the element tensor (differentiable).

    Build with :func:`modeconn.match.parametrize.make_transform`. Attributes: ``group`` (the
    :class:`~modeconn.symmetry.groups.Group`), ``parameterization`` (:class:`Parameterization`), ``size`` (the
    space size ``n``). Subclasses take ``(group, element, parameterization)``.
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
