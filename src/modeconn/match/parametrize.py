"""Continuous parameterisations of the symmetry groups, for learning group elements by gradient descent.

Dual learned matching (LMC-DM, docs/methods.md §3) and its one-sided predecessor (Theus et al. 2025) learn the
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

Each group declares its transform class next to its definition (the ``transform`` hook of
:mod:`modeconn.symmetry.groups`; ``None`` for discrete groups); :func:`make_transform` only dispatches through it.

``GroupTransform.element()`` is the detached element to hand to :meth:`SymmetrySpec.apply` (projected to the
group for ``unconstrained``); ``forward()`` is the differentiable one used inside the training loop. Parameters
and buffers live on the initial element's device in its dtype (fp32 or fp64).
"""

from __future__ import annotations

import torch

from ..errors import SpecError
from ..symmetry.groups import Group
from ..symmetry.groups.heads import HeadTransform
from ..symmetry.groups.invertible import InvertibleTransform
from ..symmetry.groups.learning import PARAMETERIZATIONS, GroupTransform, Parameterization, get_parameterization, polar_factor
from ..symmetry.groups.orthogonal import OrthogonalTransform
from ..symmetry.groups.scaling import ScalingTransform

__all__ = [
    "PARAMETERIZATIONS", "GroupTransform", "HeadTransform", "InvertibleTransform", "OrthogonalTransform",
    "Parameterization", "ScalingTransform", "get_parameterization", "make_transform", "polar_factor",
]


def make_transform(group: Group, element: torch.Tensor, parameterization: str | Parameterization = "cayley") -> GroupTransform:
    """A :class:`GroupTransform` for ``group`` initialised exactly at ``element`` (``forward()`` returns values equal to
    ``element`` before any update): the group's ``transform`` hook built with the parameterisation.

    Args:
        group: a continuous group instance (``spec.group_of(space)``): orthogonal, invertible, scaling,
            head_orthogonal or head_invertible (any group whose ``transform`` is not None).
        element: its initial element (float tensor of the group's element shape; validated with ``group.check``).
        parameterization: a name in :data:`PARAMETERIZATIONS` (default ``"cayley"``).
    Raises: ConfigError (unknown parameterisation), SpecError (a discrete or unknown group, an invalid element).
    """
    par = get_parameterization(parameterization)
    cls = getattr(group, "transform", None)
    if cls is None:
        raise SpecError(
            f"group {getattr(group, 'name', group)!r} has no continuous parameterisation (discrete groups are matched, "
            "not learned, by dual matching)"
        )
    n = element.shape[0] if isinstance(element, torch.Tensor) and element.dim() else 0
    group.check(element, n, f"<initial {group.name} element>")
    return cls(group, element.detach(), par)
