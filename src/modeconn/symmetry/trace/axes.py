"""Union-find over the spaces of permuted axes, with splits of a space into consecutive parts (per-head
children) and frozen spaces (the model's inputs and outputs, and whatever joins them: never permuted)."""

from __future__ import annotations

import itertools

import torch.fx

from ...errors import TraceError


class Axes:
    """Spaces by id: size, frozen flag, creator name (the space's name in the spec), and split parts."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.size: list[int] = []
        self.frozen: list[bool] = []
        self.creator: list[str] = []
        self.children: dict[int, tuple[int, ...]] = {}  # split space (a root when split) → its consecutive parts

    def new_space(self, n: int, creator: str, frozen: bool = False) -> int:
        self.parent.append(len(self.parent))
        self.size.append(n)
        self.frozen.append(frozen)
        self.creator.append(creator)
        return len(self.parent) - 1

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int, node: torch.fx.Node) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if self.size[ra] != self.size[rb]:
            where = repr(node.name) if node is not None else "a shared layer"
            raise TraceError(f"node {where} joins spaces of sizes {self.size[ra]} and {self.size[rb]}")
        parts: list[tuple[int, int]] = []
        if ra in self.children or rb in self.children:  # joining a split space: split the other alike, join part by part
            sizes = [self.size[c] for c in self.children.get(ra) or self.children[rb]]
            ka, kb = self.split_at(ra, sizes), self.split_at(rb, sizes)
            if ka is None or kb is None:  # split into different parts: only the identity fits both
                self.set_frozen(ra)
                self.set_frozen(rb)
                return
            parts = list(zip(ka, kb, strict=False))
        ra, rb = min(ra, rb), max(ra, rb)
        self.parent[rb] = ra
        frozen = self.frozen[ra] or self.frozen[rb]
        for pa, pb in parts:
            self.union(pa, pb, node)
        if frozen:
            self.set_frozen(ra)

    def split(self, sid: int, k: int) -> tuple[int, ...] | None:
        """The ``k`` equal consecutive parts of space ``sid`` (created on first use); ``None`` if it is already
        split into parts that neither refine nor coarsen these, or its size is not a multiple of ``k``. Splitting
        restricts the space's group to permutations within each part (always safe: a subgroup of a symmetry group is
        a symmetry group)."""
        n = self.size[self.find(sid)]
        return None if n % k else self.split_at(sid, [n // k] * k)

    def split_at(self, sid: int, sizes: list[int]) -> tuple[int, ...] | None:
        """The consecutive parts of space ``sid`` of ``sizes`` (summing to its size; created on first use, and over
        parts made before: each of those split further, or grouped under new parts), or ``None`` if it is already
        split at cuts that are neither among these nor hold all of them."""
        r = self.find(sid)
        if len(sizes) == 1:
            return (r,)
        if sum(sizes) != self.size[r] or min(sizes) < 1:
            return None
        if r not in self.children:
            self.children[r] = tuple(self.new_space(n, f"{self.creator[r]}[{i}]", self.frozen[r]) for i, n in enumerate(sizes))
        have = [self.size[c] for c in self.children[r]]
        if have == list(sizes):
            return self.children[r]
        cuts, have_cuts = set(itertools.accumulate(sizes)), set(itertools.accumulate(have))
        if cuts <= have_cuts:
            return self.coarsened(r, sizes)
        return self.refined(r, sizes) if have_cuts <= cuts else None

    def coarsened(self, r: int, sizes: list[int]) -> tuple[int, ...]:
        """Space ``r``, split into finer parts than ``sizes``, split into ``sizes`` first, each of those into the
        finer parts it holds (EfficientViT's q/k/v groups of a grouped convolution inside the heads of attention)."""
        parts, finer = [], list(self.children[r])
        for n in sizes:
            held = []
            while sum(self.size[c] for c in held) < n:
                held.append(finer.pop(0))
            if len(held) == 1:
                parts.append(held[0])
                continue
            mid = self.new_space(n, f"{self.creator[r]}[{len(parts)}]", self.frozen[r])
            self.children[mid] = tuple(held)
            parts.append(mid)
        self.children[r] = tuple(parts)
        return self.children[r]

    def refined(self, r: int, sizes: list[int]) -> tuple[int, ...] | None:
        """The parts ``sizes`` of space ``r``, already split into coarser parts: each of those split further."""
        out: list[int] = []
        rest = list(sizes)
        for c in self.children[r]:
            held = []
            while sum(held) < self.size[c]:
                held.append(rest.pop(0))
            inner = self.split_at(c, held)
            if inner is None:
                return None
            out += inner
        return tuple(out)

    def leaves(self, sid: int, block: int, offset: int) -> list[tuple[int, int]]:
        """(root, offset) of each unsplit space making up ``sid``, in order along an axis where it starts at ``offset``."""
        r = self.find(sid)
        if r not in self.children:
            return [(r, offset)]
        out: list[tuple[int, int]] = []
        for c in self.children[r]:
            out += self.leaves(c, block, offset)
            offset += self.size[c] * block
        return out

    def set_frozen(self, sid: int) -> None:
        r = self.find(sid)
        self.frozen[r] = True
        for c in self.children.get(r, ()):
            self.set_frozen(c)
