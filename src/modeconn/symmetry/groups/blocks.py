"""``block_permutation``: one permutation of ``dim`` entries per unit (S_dim)^n — the hidden units inside each expert
of a Mixture-of-Experts layer, a child of the expert permutation — with its weight-matching solver (a linear
assignment per unit, or per unit pair under the parent: the inner problems of the two-level expert matching)."""

from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from ...errors import SpecError
from .base import GROUPS, Group
from .solving import IsometricSolver


def best_permutations(group, k: torch.Tensor) -> torch.Tensor:
    """argmax of ``⟨M, K⟩`` over permutation matrices, per batch entry of ``K`` (…, d, d): one linear assignment each
    (scipy's ``linear_sum_assignment``, exact). Returns fp64 one-hot matrices of ``K``'s shape."""
    flat = k.detach().reshape(-1, *k.shape[-2:]).double().cpu().numpy()
    if not np.isfinite(flat).all():
        raise SpecError(f"{group.name}: the matching score holds NaN or Inf")
    out = torch.zeros(flat.shape, dtype=torch.float64)
    for b, score in enumerate(flat):
        rows, cols = linear_sum_assignment(score, maximize=True)
        out[b, torch.as_tensor(rows), torch.as_tensor(cols)] = 1.0
    return out.reshape(k.shape).to(k.device)


@GROUPS.register("block_permutation")
class BlockPermutationGroup(Group):
    """(S_dim)^n: unit ``i`` holds ``dim`` entries permuted by its own ``g[i]``. An element is a LongTensor (n, dim),
    each row a permutation (entry ``j`` of unit ``i`` of the new parameters is entry ``g[i, j]`` of the old unit);
    applied by index gathering, exact in every dtype. Unit-wise: the child of a permutation that moves whole units
    (experts) while each keeps its own hidden-unit order.

    Weight matching: per unit (pair) the linear assignment maximising ``⟨M, K⟩`` (:func:`best_permutations`), with
    :meth:`matrices` / :meth:`from_matrices` converting between elements and one-hot matrices. Learned: none."""

    name = "block_permutation"
    unitwise = True
    solver = IsometricSolver(best_permutations)
    transform = None

    def __init__(self, dim: int) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise SpecError(f"{self.name}: dim (entries per unit) must be a positive int, got {dim!r}")
        self.dim = dim

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim})"

    def identity(self, n):
        return torch.arange(self.dim).expand(n, self.dim).clone()

    def random(self, n, generator):
        return torch.stack([torch.randperm(self.dim, generator=generator) for _ in range(n)]) if n else self.identity(0)

    def compose(self, g, h):
        return torch.gather(h, 1, g.to(h.device))

    def inverse(self, g):
        return torch.argsort(g, dim=1)

    def check(self, g, n, space):
        if not isinstance(g, torch.Tensor) or g.dtype not in (torch.int64, torch.int32) or tuple(g.shape) != (n, self.dim):
            shape = tuple(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
            raise SpecError(f"space {space!r}: a {self.name} element is an integer tensor of shape ({n}, {self.dim}), "
                            f"got {shape}")
        if not torch.equal(torch.sort(g.cpu(), dim=1).values, self.identity(n).to(g.dtype)):
            raise SpecError(f"space {space!r}: a row of the element is not a permutation of 0..{self.dim - 1}")

    def equal(self, g, h):
        return torch.equal(g.cpu(), h.cpu())

    def permute_units(self, g, perm):
        return g[perm.to(g.device)]

    def act(self, t, axis, g, side, block, cache=None):
        n = g.shape[0]
        x = t.movedim(axis, 0)
        units = x.reshape(n, self.dim, -1)
        idx = g.to(t.device)[:, :, None].expand(-1, -1, units.shape[-1])
        return torch.gather(units, 1, idx).reshape(x.shape).movedim(0, axis)

    def matrices(self, g: torch.Tensor) -> torch.Tensor:
        """The one-hot (n, dim, dim) fp64 matrices ``M[i]`` with ``M[i] @ unit_i`` = the acted unit."""
        out = torch.zeros(g.shape[0], self.dim, self.dim, dtype=torch.float64, device=g.device)
        return out.scatter_(2, g[:, :, None].long(), 1.0)

    def from_matrices(self, m: torch.Tensor) -> torch.Tensor:
        """The element (n, dim) of one-hot matrices (the inverse of :meth:`matrices`)."""
        return m.argmax(dim=-1).long()
