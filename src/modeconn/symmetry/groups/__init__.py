"""Groups that act on a space, and how one element acts on one tensor axis.

A *space* of size ``n`` is a hidden dimension of a network (units of a layer, channels, a residual
stream, the heads of an attention layer). A group element ``g`` acts on activations ``h`` living in that
space as ``h' = M_g h``. To keep the network's function, every tensor axis that *writes* the space (output
side, e.g. rows of a Linear weight, a bias, BatchNorm statistics) is transformed by ``M_g`` and every axis
that *reads* it (input side, e.g. columns of the next Linear weight) by ``M_g^{-1}`` from the right, i.e.
along that axis the vector transforms by ``M_g^{-T}`` (docs/methods.md §0). For permutations and rotations
``M_g^{-T} = M_g``, so both sides reduce to the same operation.

A bound axis range has ``n·block`` entries: ``block`` consecutive entries form one *unit* (conv → flatten:
``block = H·W``; heads: ``block = head_dim``). A group acts on units; what it does inside a unit depends on
the group:

=================== ============================== =============================================================
group (params)      element                        ``M_g`` on an axis of ``n`` units of ``block`` entries
=================== ============================== =============================================================
``permutation``     LongTensor ``(n,)`` ``perm``    ``(M h)_i = h_{perm[i]}`` (index gather; exact in every dtype)
``orthogonal``      float ``(n, n)`` ``Q``          ``Q ⊗ I_block``; ``QᵀQ = I`` (the global residual rotation)
``invertible``      float ``(n, n)`` ``A``          ``A ⊗ I_block``; ``A`` invertible (GL(n))
``scaling``         float ``(n,)`` ``s > 0``        ``diag(s) ⊗ I_block`` (ReLU units, the linear branch of a GLU)
``head_orthogonal`` float ``(n, d, d)`` ``C``       ``blockdiag(C_0 … C_{n-1})``, each ``C_i ∈ O(d)``; ``block = d``
 (dim=d, rotary_dims, rotary_pairing)
``head_invertible`` float ``(n, d, d)`` ``C``       ``blockdiag(C_0 … C_{n-1})``, each ``C_i ∈ GL(d)``; ``block = d``
 (dim=d, rotary_dims, rotary_pairing)
=================== ============================== =============================================================

``head_*`` groups: one ``d × d`` transform per attention head (the per-head QK circuit
``W_Q^h → A W_Q^h, W_K^h → A^{-T} W_K^h`` — q rows bound on the output side, k rows on the input side — and
the OV circuit ``W_V^h → B W_V^h, W_O^h → W_O^h B^{-1}`` — v rows output side, o_proj columns input side;
docs/methods.md §0/§3, Theus et al. 2025.) With ``rotary_dims = r > 0`` the first ``r`` dims of every head are
rotated by rotary embeddings (RoPE): the score ``(R_m q)ᵀ(R_n k)`` becomes ``qᵀAᵀR_mᵀR_n A^{-T}k``, unchanged
at all positions iff ``A`` commutes with every RoPE rotation, i.e. (for distinct RoPE frequencies) on each
rotated pair ``(p, q)`` it is a scaled rotation ``[[a, -b], [b, a]]`` (``a² + b² = 1`` for
``head_orthogonal``), no entry couples different pairs or a
rotary dim with a non-rotary one, and the remaining ``d − r`` dims (partial rotary, GPT-NeoX
``rotary_pct``) carry an unrestricted ``O(d−r)`` / ``GL(d−r)`` block. Pairs: ``rotary_pairing="half"``
(GPT-NeoX / Llama / HF ``rotate_half``: ``(i, i + r/2)``, ``i < r/2``) or ``"interleaved"`` (GPT-J:
``(2i, 2i+1)``).

*Head permutations with per-head transforms (a wreath product).* Heads move as whole blocks under a
``permutation`` space of size ``H`` (bindings with ``block = head_dim``, or ``3·head_dim`` on a fused qkv
axis) and each head carries its own QK and OV transform: ``head_*`` spaces declared with ``parent=`` the
head-permutation space (:class:`~modeconn.symmetry.spec.Space`). The combined element is
``M = D_C · P_perm`` — heads are moved first, then unit ``i`` of the result is transformed by ``C[i]``
(``C`` is indexed by the *new* position). The same construction gives FFN permutation + per-unit scaling
(``scaling`` space with the FFN permutation as parent). Composition and inversion then mix the spaces:
``(π, C)∘(σ, E) = (σ[π], C·E[π])`` (``σ[π]`` is ``permutation.compose(π, σ)``; ``C·E[π]`` multiplies unit by
unit) and ``(π, C)^{-1} = (π^{-1}, C^{-1}[π^{-1}])``; the spec does that with :meth:`Group.permute_units`.
Groups allowed as children are the *unit-wise* ones (``scaling``, ``head_*``).

Numerics: continuous groups compute in fp32 (fp64 if the tensor is fp64) and cast back to the tensor's
dtype once; bf16/fp16 storage is never used for arithmetic. Elements are fp32 (``random``, ``identity``,
matching results) or fp64 tensors; group operations on them run in fp64 and return the elements' dtype.
``equal`` of continuous elements is ``allclose`` with ``rtol = 1e-4`` and ``atol = 1e-4·max(1, max|h|)``.
``check`` raises :class:`~modeconn.errors.SpecError` naming the space for a wrong dtype/shape, NaN/Inf, a
non-orthogonal matrix (``max|QᵀQ − I| > 1e-3``), a singular one (1-norm condition number above ``1e7``,
i.e. numerically singular in fp32), a non-positive scale, or a head transform that does not commute with
RoPE (deviation from the pair structure above ``1e-4·max(1, max|C|)``).

*A group is one module.* Each group lives in its own module of this package together with its
weight-matching solver (``solver``: a :class:`~.solving.Solver`, :data:`~.solving.ASSIGNMENT` for permutations)
and its learned parameterisation (``transform``: a :class:`~.learning.GroupTransform` subclass); both hooks are
declared explicitly (``None`` where a group has none — weight matching then refuses its spaces, naming the group
and the space, and dual matching cannot learn it). A new group is one new module registering itself with
``@GROUPS.register(name)`` plus its import line below; the spec, the application code, weight matching
(:mod:`modeconn.match.solvers`) and learned matching (:mod:`modeconn.match.parametrize`) only go through the
hooks and the class flags (``exact``, ``isometric``, ``unitwise``, ``per_head``). Shared numerics live in
:mod:`.base`, shared closed-form solves in :mod:`.solving`, shared parameterisation blocks in :mod:`.learning`.
"""

from __future__ import annotations

from .base import (
    EQUAL_ATOL,
    EQUAL_RTOL,
    GROUPS,
    MAX_CONDITION,
    ORTHOGONAL_TOL,
    STRUCTURE_TOL,
    ContinuousGroup,
    Group,
    Side,
    compute_dtype,
    get_group,
)
from .learning import PARAMETERIZATIONS, GroupTransform, Parameterization, get_parameterization
from .solving import ASSIGNMENT, Solver, Stats

# the registered groups: one module each (importing a module registers its group)
from .permutation import PermutationGroup  # noqa: E402  isort: skip
from .orthogonal import OrthogonalGroup  # noqa: E402  isort: skip
from .invertible import InvertibleGroup  # noqa: E402  isort: skip
from .scaling import ScalingGroup  # noqa: E402  isort: skip
from .heads import HeadInvertibleGroup, HeadOrthogonalGroup  # noqa: E402  isort: skip
from .blocks import BlockPermutationGroup  # noqa: E402  isort: skip

__all__ = [
    "ASSIGNMENT", "BlockPermutationGroup", "EQUAL_ATOL", "EQUAL_RTOL", "GROUPS", "MAX_CONDITION", "ORTHOGONAL_TOL", "PARAMETERIZATIONS",
    "STRUCTURE_TOL", "ContinuousGroup", "Group", "GroupTransform", "HeadInvertibleGroup", "HeadOrthogonalGroup",
    "InvertibleGroup", "OrthogonalGroup", "Parameterization", "PermutationGroup", "ScalingGroup", "Side", "Solver",
    "Stats", "compute_dtype", "get_group", "get_parameterization",
]
