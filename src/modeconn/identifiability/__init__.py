"""Neuron identifiability and symmetry breaking: pure tensor math (docs/methods.md §1).

No models and no data loading here — every function takes tensors (or arrays) and returns tensors or floats.

W-asymmetric neuron ``i``: effective weights ``f_i + d_i ⊙ w`` (``F`` fixed offsets, ``D`` fixed mask, ``w``
trained). On inputs in ``span(U)`` (``U`` ``d_in × k``, orthonormal columns):

- :func:`realization_cost` — ``c_i(a) = min ‖w‖² s.t. Uᵀ(f_i + d_i ⊙ w) = a
  = (a − b_i)ᵀ G_i⁺ (a − b_i)``, ``b_i = Uᵀ f_i``, ``G_i = Uᵀ diag(d_i)² U`` (``+inf`` if unreachable).
- :func:`assignment_margin` — best vs second-best assignment of ``C[i, j] = c_i(a_j)`` (exact);
  :func:`swap_costs` — ``Δ`` of every transposition; :func:`permutation_sensitivity` — ``Δ_π``.
- :func:`subspace_coherence` — ``ν(U) = (d_in/k) · max_j ‖Uᵀ e_j‖² ∈ [1, d_in/k]``; :func:`orthonormalize`;
  :func:`estimate_subspace` (PCA); :func:`center_separation` (spread of the projected centers ``b_i``).
- :func:`chord_deviation` / :func:`max_chord_deviation` — outputs along a path minus the chord.
- :func:`identity_vs_optimal` — activation-matching objective of the identity vs the optimal permutation.
"""

from .assignment import AssignmentMargin, assignment_margin, identity_vs_optimal, permutation_sensitivity, swap_costs
from .chord import chord_deviation, max_chord_deviation
from .realization import RANK_RTOL, realization_cost
from .subspace import center_separation, estimate_subspace, orthonormalize, subspace_coherence

__all__ = [
    "RANK_RTOL",
    "AssignmentMargin",
    "assignment_margin",
    "center_separation",
    "chord_deviation",
    "estimate_subspace",
    "identity_vs_optimal",
    "max_chord_deviation",
    "orthonormalize",
    "permutation_sensitivity",
    "realization_cost",
    "subspace_coherence",
    "swap_costs",
]
