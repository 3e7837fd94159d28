"""``permutation``: the symmetric group S_n, solved by weight matching's linear assignment, never learned."""

from __future__ import annotations

import torch

from ...errors import SpecError
from .base import GROUPS, Group
from .solving import ASSIGNMENT


@GROUPS.register("permutation")
class PermutationGroup(Group):
    """The symmetric group S_n. An element is a LongTensor ``perm`` of shape (n,): unit ``i`` of the new
    parameters is unit ``perm[i]`` of the old ones (``h'_i = h_{perm[i]}``). Applied by index gathering,
    never by a dense matmul, so it is exact in every dtype.

    Weight matching: a linear assignment problem per space (:data:`~.solving.ASSIGNMENT`). Learned matching: none
    (discrete; dual matching keeps the weight-matching permutation)."""

    name = "permutation"
    solver = ASSIGNMENT
    transform = None

    def identity(self, n: int) -> torch.Tensor:
        return torch.arange(n)

    def random(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randperm(n, generator=generator)

    def compose(self, g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        # (h·θ)[i] = θ[h[i]];  (g·(h·θ))[i] = (h·θ)[g[i]] = θ[h[g[i]]]
        return h[g.to(h.device)]

    def inverse(self, g: torch.Tensor) -> torch.Tensor:
        return torch.argsort(g)

    def check(self, g: torch.Tensor, n: int, space: str) -> None:
        if not isinstance(g, torch.Tensor) or g.dtype not in (torch.int64, torch.int32) or g.shape != (n,):
            shape = tuple(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
            raise SpecError(f"space {space!r}: a permutation must be an integer tensor of shape ({n},), got {shape}")
        if not torch.equal(torch.sort(g.cpu()).values, torch.arange(n, dtype=g.dtype)):
            raise SpecError(f"space {space!r}: element is not a permutation of 0..{n - 1}")

    def equal(self, g: torch.Tensor, h: torch.Tensor) -> bool:
        return torch.equal(g.cpu(), h.cpu())

    def act(self, t, axis, g, side, block, cache=None):
        g = g.to(t.device)
        if block > 1:
            g = (g[:, None] * block + torch.arange(block, device=t.device)).reshape(-1)
        return t.index_select(axis, g)
