"""The symmetry IR: named spaces, each acted on by a group, and every tensor axis bound to a space.

A :class:`SymmetrySpec` is the single declarative source of truth for a model's parameter symmetries
(git-re-basin's ``axes_to_perm`` table generalised to any group, to blocks and to concatenations).
Everything else — which tensors a space touches, matching costs, application — is derived from it.

Conventions (see :mod:`modeconn.symmetry.groups`): an element ``g`` is a dict ``space name → tensor``;
``spec.apply(θ, g)`` is ``g·θ`` and computes the same function as ``θ``;
``compose(g, h)·θ = g·(h·θ)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Mapping

import torch

from ..errors import SpecError, StateDictMismatchError
from .groups import Side, get_group

Element = dict[str, torch.Tensor]
StateDict = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Space:
    """A hidden dimension of size ``size`` acted on by the group named ``group``."""

    name: str
    size: int
    group: str = "permutation"


@dataclass(frozen=True)
class AxisBinding:
    """Axis ``axis`` of a tensor bound to ``space`` on ``side``.

    The bound range of the axis is ``[offset, offset + size(space) * block)``: ``block`` consecutive
    entries move together per unit (conv → flatten → Linear: ``block = H·W``; attention heads:
    ``block = head_dim``); ``offset`` places one part of a concatenation. Unless ``partial`` is set (one
    part of a concatenation), the bindings of an axis must cover it entirely, so a size mismatch between
    a hand-written spec and a model is caught.
    """

    axis: int
    space: str
    side: Side = "out"
    block: int = 1
    offset: int = 0
    partial: bool = False


@dataclass(frozen=True)
class Probe:
    """Where activations of a space can be observed: the input (``where="input"``) or output of
    ``module``, along ``dim``, at ``[offset, offset + n·block)``. Used by activation matching."""

    module: str
    where: str
    dim: int
    offset: int = 0
    block: int = 1


@dataclass(frozen=True)
class SymmetrySpec:
    """Spaces plus the bindings of every tensor of a state dict.

    ``tensors`` maps *every* parameter and buffer name to its axis bindings (an empty tuple marks a tensor
    no group acts on, e.g. the output layer's bias or ``num_batches_tracked``). ``shapes`` optionally
    records the expected shape of each tensor. ``probes`` and ``repair_points`` are filled by
    :func:`modeconn.symmetry_spec` for activation matching and REPAIR.
    """

    spaces: Mapping[str, Space]
    tensors: Mapping[str, tuple[AxisBinding, ...]]
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    probes: Mapping[str, tuple[Probe, ...]] = field(default_factory=dict)
    repair_points: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        for key, binds in self.tensors.items():
            for b in binds:
                if b.space not in self.spaces:
                    raise SpecError(f"tensor {key!r} axis {b.axis} is bound to unknown space {b.space!r}")
                if b.side not in ("out", "in"):
                    raise SpecError(f"tensor {key!r} axis {b.axis}: side must be 'out' or 'in', got {b.side!r}")
        self._check_no_overlap()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_axes(
        cls,
        spaces: Mapping[str, int] | Iterable[Space],
        axes: Mapping[str, tuple] | Iterable[tuple[str, tuple]],
        group: str = "permutation",
    ) -> "SymmetrySpec":
        """Build a spec from a git-re-basin-style table.

        ``spaces``: ``{"P0": 512, ...}`` (all in ``group``) or Space objects. ``axes``: for every tensor
        of the state dict a tuple with one entry per axis — ``None`` (unbound), a space name (axis 0 binds
        its output side, other axes their input side) or an :class:`AxisBinding`. Passing ``axes`` as a
        list of pairs lets a tensor named twice be detected (SpecError).
        """
        space_map = (
            {s.name: s for s in spaces}
            if not isinstance(spaces, Mapping)
            else {name: Space(name, int(n), group) for name, n in spaces.items()}
        )
        items = list(axes.items()) if isinstance(axes, Mapping) else list(axes)
        tensors: dict[str, tuple[AxisBinding, ...]] = {}
        for key, entries in items:
            if key in tensors:
                raise SpecError(f"tensor {key!r} is named twice in the spec")
            tensors[key] = tuple(_parse_axis(i, e) for i, e in enumerate(entries) if e is not None)
        return cls(space_map, tensors)

    # ------------------------------------------------------------------ derived tables
    @cached_property
    def bindings_by_space(self) -> dict[str, tuple[tuple[str, AxisBinding], ...]]:
        """space name → every (tensor name, binding) acting on it, in tensor order."""
        out: dict[str, list[tuple[str, AxisBinding]]] = {s: [] for s in self.spaces}
        for key, binds in self.tensors.items():
            for b in binds:
                out[b.space].append((key, b))
        return {s: tuple(v) for s, v in out.items()}

    def group_of(self, space: str):
        return get_group(self.spaces[space].group)

    # ------------------------------------------------------------------ group operations
    def identity(self) -> Element:
        """The neutral element: ``{space: identity}``."""
        return {s: self.group_of(s).identity(sp.size) for s, sp in self.spaces.items()}

    def random_element(self, generator: torch.Generator | None = None, seed: int | None = None) -> Element:
        """A random element; pass an explicit ``generator`` (or ``seed``) for reproducibility."""
        if generator is None:
            if seed is None:
                raise SpecError("random_element needs an explicit torch.Generator or seed")
            generator = torch.Generator().manual_seed(seed)
        return {s: self.group_of(s).random(sp.size, generator) for s, sp in self.spaces.items()}

    def inverse(self, g: Element) -> Element:
        """``g^{-1}`` (space by space)."""
        self.check_element(g)
        return {s: self.group_of(s).inverse(g[s]) for s in self.spaces}

    def compose(self, g: Element, h: Element) -> Element:
        """``g∘h``, i.e. ``apply(θ, compose(g, h)) == apply(apply(θ, h), g)``."""
        self.check_element(g)
        self.check_element(h)
        return {s: self.group_of(s).compose(g[s], h[s]) for s in self.spaces}

    def equal(self, g: Element, h: Element) -> bool:
        """Whether two elements agree on every space."""
        return all(self.group_of(s).equal(g[s], h[s]) for s in self.spaces)

    def check_element(self, g: Element) -> None:
        """SpecError unless ``g`` has a valid entry for every space of this spec (and no other)."""
        missing = [s for s in self.spaces if s not in g]
        extra = [s for s in g if s not in self.spaces]
        if missing or extra:
            raise SpecError(f"group element does not fit the spec: missing spaces {missing}, unknown spaces {extra}")
        for s, sp in self.spaces.items():
            self.group_of(s).check(g[s], sp.size, s)

    # ------------------------------------------------------------------ application
    def apply(self, state_dict: StateDict, g: Element) -> dict[str, torch.Tensor]:
        """``g·θ``: a new state dict computing the same function as ``state_dict``.

        Tensors no group acts on are returned as the same (unmodified) objects; bound tensors are new.
        The input is never mutated. Permutations are exact in any dtype.

        Raises: :class:`StateDictMismatchError` if keys or shapes differ from the spec (names the keys and
        both shapes); :class:`SpecError` if ``g`` is not a valid element.
        """
        self.check_state_dict(state_dict)
        self.check_element(g)
        return {key: self.apply_tensor(key, t, g) for key, t in state_dict.items()}

    def apply_tensor(
        self, key: str, t: torch.Tensor, g: Element, skip: AxisBinding | None = None
    ) -> torch.Tensor:
        """Act with ``g`` on the single tensor ``key`` (all its bindings except ``skip``)."""
        for b in self.tensors[key]:
            if b is skip:
                continue
            t = _act_on_binding(t, b, g[b.space], self.spaces[b.space].size, self.group_of(b.space))
        return t

    # ------------------------------------------------------------------ validation
    def check_state_dict(self, state_dict: StateDict, what: str = "state dict") -> None:
        """StateDictMismatchError listing missing/unexpected keys and shape mismatches (cheap: no math)."""
        missing = [k for k in self.tensors if k not in state_dict]
        extra = [k for k in state_dict if k not in self.tensors]
        problems = []
        if missing:
            problems.append(f"keys in the spec but not in the {what}: {missing}")
        if extra:
            problems.append(f"keys in the {what} but not in the spec (unbound tensors): {extra}")
        for key, t in state_dict.items():
            if key in self.tensors:
                problems.extend(self._shape_problems(key, tuple(t.shape)))
        if problems:
            raise StateDictMismatchError(f"{what} does not match the symmetry spec:\n  " + "\n  ".join(problems))

    def validate(self, model_or_state_dict: torch.nn.Module | StateDict) -> None:
        """Prove every parameter and buffer is bound exactly once and every binding fits its shape.

        Accepts a model (its ``state_dict()``) or a state dict. Raises :class:`SpecError` naming the
        tensor that is unbound, bound twice or bound with the wrong size, or a space no tensor writes.
        """
        sd = (
            model_or_state_dict.state_dict()
            if isinstance(model_or_state_dict, torch.nn.Module)
            else model_or_state_dict
        )
        unbound = [k for k in sd if k not in self.tensors]
        if unbound:
            raise SpecError(f"tensors not covered by the spec (every parameter and buffer must be listed): {unbound}")
        stale = [k for k in self.tensors if k not in sd]
        if stale:
            raise SpecError(f"spec lists tensors the model does not have (spec from another architecture?): {stale}")
        for key, t in sd.items():
            problems = self._shape_problems(key, tuple(t.shape))
            if problems:
                raise SpecError("; ".join(problems))
        for s, binds in self.bindings_by_space.items():
            if not any(b.side == "out" for _, b in binds):
                raise SpecError(f"space {s!r} has no output-side (writer) tensor; bindings: {[k for k, _ in binds]}")

    def _shape_problems(self, key: str, shape: tuple[int, ...]) -> list[str]:
        problems = []
        expected = self.shapes.get(key)
        if expected is not None and tuple(expected) != shape:
            problems.append(f"tensor {key!r}: shape {shape} but the spec expects {tuple(expected)}")
        for b in self.tensors[key]:
            if b.axis >= len(shape):
                problems.append(f"tensor {key!r} has {len(shape)} axes but axis {b.axis} is bound to {b.space!r}")
                continue
            end = b.offset + self.spaces[b.space].size * b.block
            if end > shape[b.axis] or (end != shape[b.axis] and b.offset == 0 and not b.partial):
                problems.append(
                    f"tensor {key!r} axis {b.axis} has size {shape[b.axis]} but space {b.space!r} "
                    f"(size {self.spaces[b.space].size}, block {b.block}, offset {b.offset}) needs {end}"
                )
        return problems

    def _check_no_overlap(self) -> None:
        for key, binds in self.tensors.items():
            by_axis: dict[int, list[AxisBinding]] = {}
            for b in binds:
                by_axis.setdefault(b.axis, []).append(b)
            for axis, bs in by_axis.items():
                spans = sorted((b.offset, b.offset + self.spaces[b.space].size * b.block, b.space) for b in bs)
                for (s0, e0, n0), (s1, _e1, n1) in zip(spans, spans[1:]):
                    if s1 < e0:
                        raise SpecError(f"tensor {key!r} axis {axis} is bound twice (spaces {n0!r} and {n1!r} overlap)")

    # ------------------------------------------------------------------ misc
    def __repr__(self) -> str:
        bound = sum(1 for b in self.tensors.values() if b)
        return f"SymmetrySpec({len(self.spaces)} spaces, {bound}/{len(self.tensors)} tensors bound)"

    def summary(self) -> str:
        """A human-readable table: each space, its size, group and the tensors it binds."""
        lines = []
        for s, sp in self.spaces.items():
            keys = ", ".join(f"{k}[{b.axis}{'' if b.side == 'out' else '*'}]" for k, b in self.bindings_by_space[s])
            lines.append(f"{s} ({sp.group}, n={sp.size}): {keys}")
        return "\n".join(lines)


def _parse_axis(axis: int, entry: str | AxisBinding) -> AxisBinding:
    if isinstance(entry, AxisBinding):
        if entry.axis != axis:
            raise SpecError(f"AxisBinding for space {entry.space!r} says axis {entry.axis} but stands at position {axis}")
        return entry
    if isinstance(entry, str):
        return AxisBinding(axis, entry, "out" if axis == 0 else "in")
    raise SpecError(f"axis {axis}: expected None, a space name or an AxisBinding, got {entry!r}")


def _act_on_binding(t: torch.Tensor, b: AxisBinding, g: torch.Tensor, n: int, group) -> torch.Tensor:
    length = n * b.block
    if b.offset == 0 and t.shape[b.axis] == length:
        return group.act(t, b.axis, g, b.side, b.block)
    before, part, after = t.split([b.offset, length, t.shape[b.axis] - b.offset - length], dim=b.axis)
    return torch.cat([before, group.act(part, b.axis, g, b.side, b.block), after], dim=b.axis)
