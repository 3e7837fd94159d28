"""Per-space solvers of weight matching, dispatched through the group's ``solver`` hook.

Each group declares its solver next to its definition (:mod:`modeconn.symmetry.groups`; the maths of the
shared closed forms — Procrustes, the least-squares surrogate and its Sylvester equation, the best positive
scale — is in :mod:`modeconn.symmetry.groups.solving`):

=================== ===========================================================================================
group               solver
=================== ===========================================================================================
``permutation``     linear assignment on the space's score (:data:`ASSIGNMENT`; run by :mod:`.weight` itself)
``orthogonal``      Procrustes on ``K = K_out + K_in`` (exact)
``head_orthogonal`` rotary-structured Procrustes: rotations on the rotary pairs, Procrustes on the rest (exact)
``invertible``,     best (by exact ``D``) of the least-squares surrogate minimiser (exact at planted elements),
``head_invertible`` the isometric solution ``Q`` and ``c·Q`` — never worse than orthogonal alignment
``scaling``         the better of the surrogate and ``1``, refined by safeguarded Newton on the exact 1-D ``D``
``block_permutation`` per unit (or unit pair under the parent) the linear assignment maximising ``⟨M, K⟩`` (exact)
=================== ===========================================================================================

A group whose ``solver`` is ``None`` cannot be weight-matched: :func:`solver_of` / :func:`check_solvable` raise
:class:`~modeconn.errors.SpecError` naming the group and the space (a non-isometric group is never silently
solved as GL(n)). The caller keeps a result only where it lowers ``D``. All solves run in fp64 on the
statistics' device.
"""

from __future__ import annotations

import torch

from ..errors import SpecError
from ..symmetry.groups import ASSIGNMENT, Group, Solver
from ..symmetry.groups.solving import RIDGE, SCALE_RANGE, Stats, best_scale, procrustes, sylvester

__all__ = [
    "ASSIGNMENT", "RIDGE", "SCALE_RANGE", "Stats", "best_scale", "check_solvable", "cost", "groups_of",
    "is_assignment", "procrustes", "solve", "solver_of", "sylvester",
]


def solver_of(group: Group, space: str | None = None) -> Solver:
    """The closed-form :class:`~modeconn.symmetry.groups.solving.Solver` of ``group``. SpecError naming the group
    (and ``space``) when it declares none, or when it is solved by linear assignment (permutations)."""
    solver = getattr(group, "solver", None)
    if isinstance(solver, Solver):
        return solver
    where = f" of space {space!r}" if space is not None else ""
    if solver is ASSIGNMENT:
        raise SpecError(f"group {group.name!r}{where} is solved by linear assignment, not in closed form")
    kind = "isometric" if group.isometric else "non-isometric (it is never solved as GL(n) by default)"
    raise SpecError(
        f"group {group.name!r}{where} has no weight-matching solver: {kind}; declare one on the group "
        "(modeconn.symmetry.groups) or leave the space out of the spec"
    )


def is_assignment(group: Group) -> bool:
    """Whether weight matching solves ``group``'s spaces by linear assignment (permutations)."""
    return getattr(group, "solver", None) is ASSIGNMENT


def check_solvable(spec) -> None:
    """SpecError naming the first space whose group weight matching cannot solve (before any work)."""
    for s in spec.spaces:
        group = spec.group_of(s)
        if not is_assignment(group):
            solver_of(group, s)


def groups_of(spec) -> dict[str, Group]:
    """``{space: group}`` of ``spec`` after :func:`check_solvable`."""
    check_solvable(spec)
    return {s: spec.group_of(s) for s in spec.spaces}


def solve(group: Group, st: Stats, space: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per batch entry, the transform (…, d, d) fp64 and its :func:`cost`, by ``group``'s solver (table above).
    Raises SpecError (naming the group and ``space``) for a group without a closed-form solver."""
    return solver_of(group, space).solve(group, st)


def cost(group: Group, m: torch.Tensor, st: Stats, space: str | None = None) -> torch.Tensor:
    """``D(M) − Σ‖X‖²`` per batch entry: ``−2⟨M, K_out⟩ + ‖M Y‖²_out − 2⟨M^{-T}, K_in⟩ + ‖M^{-T} Y‖²_in``
    (``tr Q − 2⟨M, K⟩`` for isometric groups, where weight matching leaves ``Q = 0``: a constant that cancels in
    every comparison). ``m``: (…, d, d) fp64. A singular ``M`` costs ``+inf``."""
    return solver_of(group, space).cost(group, m, st)
