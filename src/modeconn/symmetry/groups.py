"""Groups that act on a space, and how one element acts on one tensor axis.

A *space* of size ``n`` is a hidden dimension of a network (units of a layer, channels, a residual
stream). A group element ``g`` acts on activations ``h ∈ R^n`` living in that space as ``h' = M_g h``.
To keep the network's function, every tensor axis that *writes* the space (output side, e.g. rows of a
Linear weight, a bias, BatchNorm statistics) is transformed by ``M_g`` and every axis that *reads* it
(input side, e.g. columns of the next Linear weight) by ``M_g^{-1}`` from the right. For permutations and
rotations ``M_g^{-1} = M_g^T``, so both sides reduce to the same index gather.

New groups (orthogonal, invertible, scaling, head permutations …) subclass :class:`Group` and register
in :data:`GROUPS`; the spec and the application code are group-agnostic.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Literal

import torch

from ..errors import SpecError
from ..registry import Registry

Side = Literal["out", "in"]

GROUPS: Registry["Group"] = Registry("group")


class Group(ABC):
    """A family of groups indexed by the space size ``n``; elements are tensors."""

    name: str

    @abstractmethod
    def identity(self, n: int) -> torch.Tensor:
        """The neutral element of the group acting on a space of size ``n``."""

    @abstractmethod
    def random(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """A random element drawn with ``generator`` (same seed → same element)."""

    @abstractmethod
    def compose(self, g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``g∘h``: acting with the result equals acting with ``h`` first, then ``g``."""

    @abstractmethod
    def inverse(self, g: torch.Tensor) -> torch.Tensor:
        """``g^{-1}``."""

    @abstractmethod
    def check(self, g: torch.Tensor, n: int, space: str) -> None:
        """Raise :class:`SpecError` naming ``space`` unless ``g`` is a valid element for size ``n``."""

    @abstractmethod
    def equal(self, g: torch.Tensor, h: torch.Tensor) -> bool:
        """Whether two elements are the same (exactly for discrete groups)."""

    @abstractmethod
    def act(self, t: torch.Tensor, axis: int, g: torch.Tensor, side: Side, block: int) -> torch.Tensor:
        """Act on axis ``axis`` of ``t`` whose size is ``n * block`` (``block`` consecutive entries per unit).

        ``side="out"``: the axis writes the space; ``side="in"``: it reads it. Returns a new tensor.
        """


@GROUPS.register("permutation")
class PermutationGroup(Group):
    """The symmetric group S_n. An element is a LongTensor ``perm`` of shape (n,): unit ``i`` of the new
    parameters is unit ``perm[i]`` of the old ones (``h'_i = h_{perm[i]}``). Applied by index gathering,
    never by a dense matmul, so it is exact in every dtype."""

    name = "permutation"

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

    def act(self, t: torch.Tensor, axis: int, g: torch.Tensor, side: Side, block: int) -> torch.Tensor:
        g = g.to(t.device)
        if block > 1:
            g = (g[:, None] * block + torch.arange(block, device=t.device)).reshape(-1)
        return t.index_select(axis, g)


def get_group(name: str) -> Group:
    """The registered group called ``name`` (ConfigError listing the valid names otherwise)."""
    return GROUPS.get(name)()  # type: ignore[operator]
