"""The symmetry IR: named spaces, each acted on by a group, and every tensor axis bound to a space.

A :class:`SymmetrySpec` is the single declarative source of truth for a model's parameter symmetries
(git-re-basin's ``axes_to_perm`` table generalised to any group, to blocks, strides and concatenations).
Everything else — which tensors a space touches, matching costs, application — is derived from it.

Conventions (see :mod:`modeconn.symmetry.groups`): an element ``g`` is a dict ``space name → tensor``;
``spec.apply(θ, g)`` is ``g·θ`` and computes the same function as ``θ``;
``compose(g, h)·θ = g·(h·θ)``.

*Parent and child spaces (wreath products).* A space declared ``Space(..., parent="P")`` is a *child* of the
permutation space ``P`` (same size, a unit-wise group: ``scaling`` or ``head_*``). Its bindings must lie
inside bindings of ``P`` on the same tensor axis (unit ``i`` of the child inside unit ``i`` of the parent);
on such a range the parent acts first, then the child: ``M = D_C · P_perm`` (unit ``i`` of ``g·θ`` is old
unit ``perm[i]`` transformed by ``C[i]``). This is how heads permute as whole blocks while each head keeps
its own QK and OV transform (docs/methods.md §0, §3; Theus et al. 2025), and how FFN units get a permutation and
a per-unit scaling. A child binding with ``unit_axis`` puts its units on *another* axis of the tensor, the one the
parent binds with ``block = 1``: unit ``i`` is index ``i`` of ``unit_axis`` and the child acts, inside it, on
entries ``[offset, offset + block)`` of ``axis`` — Mixture-of-Experts banks stored as one ``(experts, hidden, d)``
tensor: the experts permute along axis 0 (with the router's rows), the hidden units of each expert along axis 1
by a permutation of their own (``block_permutation``). ``compose``/``inverse`` implement the semidirect product exactly:
``(π, C)∘(σ, E) = (σ[π], C·E[π])`` and ``(π, C)^{-1} = (π^{-1}, C^{-1}[π^{-1}])``.

Example — one GPT-NeoX attention layer (fused ``query_key_value`` laid out per head as
``[q_h | k_h | v_h]``, ``H`` heads of ``d`` dims, ``r = rotary_pct·d`` rotary dims; residual space ``R``)::

    spaces = {
        "L0.heads": Space("L0.heads", H),                                       # head permutation
        "L0.qk": Space("L0.qk", H, "head_invertible", parent="L0.heads",
                       params={"dim": d, "rotary_dims": r, "rotary_pairing": "half"}),
        "L0.ov": Space("L0.ov", H, "head_invertible", parent="L0.heads", params={"dim": d}),
    }
    qkv = (AxisBinding(0, "L0.heads", "out", block=3 * d),                       # whole heads move
           AxisBinding(0, "L0.qk", "out", block=d, offset=0, stride=3 * d),       # q rows: A
           AxisBinding(0, "L0.qk", "in", block=d, offset=d, stride=3 * d),        # k rows: A^{-T}
           AxisBinding(0, "L0.ov", "out", block=d, offset=2 * d, stride=3 * d),   # v rows: B
           AxisBinding(1, "R", "in"))
    tensors = {
        "layers.0.attention.query_key_value.weight": qkv,
        "layers.0.attention.query_key_value.bias": qkv[:4],
        "layers.0.attention.dense.weight": (AxisBinding(0, "R", "out"),
                                            AxisBinding(1, "L0.heads", "in", block=d),
                                            AxisBinding(1, "L0.ov", "in", block=d)),  # o columns: B^{-1}
        "layers.0.attention.dense.bias": (AxisBinding(0, "R", "out"),),
    }

*Tied tensors (aliases).* ``aliases`` maps an alias key to its primary key (GPT-2's ``lm_head.weight`` →
``transformer.wte.weight``): the alias is listed in ``tensors`` without bindings of its own, ``apply`` transforms
the primary once and returns the *same* tensor object under the alias key (so tied weights stay tied, in values
and, loaded into a model, in storage), no objective counts the matrix twice, and the alias may be missing from a
state dict (``save_pretrained`` drops tied keys). The spec refuses an alias whose primary it does not list or
that carries bindings of its own (SpecError naming both keys); ``validate`` also proves every alias present in
the model really is tied (same storage or equal values).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from collections.abc import Iterable, Mapping

import torch

from ..errors import ConfigError, SpecError, StateDictMismatchError
from .groups import Group, Side, compute_dtype, get_group

__all__ = ["AxisBinding", "Element", "Probe", "Space", "StateDict", "SymmetrySpec", "apply_gathers", "storage_key"]

Element = dict[str, torch.Tensor]
StateDict = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Space:
    """A hidden dimension of ``size`` units acted on by the group named ``group``.

    ``params``: keyword parameters of the group (a mapping, stored as a sorted tuple of pairs), e.g.
    ``{"dim": 64, "rotary_dims": 16}`` for ``head_invertible``. ``parent``: the name of a ``permutation``
    space of the same size whose element reorders this space's units before this space acts (see the module
    docstring); ``None`` for an independent space.
    """

    name: str
    size: int
    group: str = "permutation"
    parent: str | None = None
    params: tuple = ()

    def __post_init__(self) -> None:
        params = self.params
        if isinstance(params, Mapping):
            params = tuple(sorted(params.items()))
        object.__setattr__(self, "params", tuple(tuple(p) for p in params))


@dataclass(frozen=True)
class AxisBinding:
    """Axis ``axis`` of a tensor bound to ``space`` on ``side``.

    The bound range of the axis is ``[offset, offset + size(space) * block)``: ``block`` consecutive
    entries move together per unit (conv → flatten → Linear: ``block = H·W``; attention heads:
    ``block = head_dim``); ``offset`` places one part of a concatenation. Unless ``partial`` is set (one
    part of a concatenation), the bindings of an axis must cover it entirely, so a size mismatch between
    a hand-written spec and a model is caught.

    ``stride`` (default ``block``): unit ``i`` occupies ``[offset + i·stride, offset + i·stride + block)``.
    A stride larger than the block interleaves several bindings on one axis, e.g. GPT-NeoX's fused
    ``query_key_value`` rows laid out per head as ``[q_h | k_h | v_h]``: q, k and v parts are bound with
    ``block = d``, ``stride = 3d`` and offsets ``0, d, 2d``. Unless ``partial``, a strided binding needs
    ``size·stride`` = the axis length.

    ``unit_axis`` (child spaces only): the units lie along that other axis — unit ``i`` is index ``i`` there — and
    each acts on the same entries ``[offset, offset + block)`` of ``axis`` (the hidden units of expert ``i`` in a
    stacked ``(experts, hidden, d)`` bank); the parent binds ``unit_axis`` with ``block = 1``.
    """

    axis: int
    space: str
    side: Side = "out"
    block: int = 1
    offset: int = 0
    partial: bool = False
    stride: int | None = None
    unit_axis: int | None = None

    @property
    def step(self) -> int:
        """The distance between the starts of consecutive units (``stride``, or ``block`` when unset; ``0`` with
        ``unit_axis``: every unit reads the same entries of ``axis``, in its own index of ``unit_axis``)."""
        if self.unit_axis is not None:
            return 0
        return self.block if self.stride is None else self.stride

    def indices(self, n: int, device=None) -> torch.Tensor:
        """The axis indices of the ``n`` units' entries, unit by unit (LongTensor of shape (n·block,); with
        ``unit_axis`` the ``block`` indices every unit shares)."""
        if self.unit_axis is not None:
            return self.offset + torch.arange(self.block, device=device)
        start = self.offset + torch.arange(n, device=device)[:, None] * self.step
        return (start + torch.arange(self.block, device=device)).reshape(-1)

    def span(self, n: int) -> int:
        """One past the last axis index the binding touches for a space of ``n`` units."""
        if self.unit_axis is not None:
            return self.offset + self.block
        return self.offset + (n - 1) * self.step + self.block if n else self.offset


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
    :func:`modeconn.symmetry_spec` for activation matching and REPAIR. ``aliases``: tied tensors, alias key →
    primary key (see the module docstring). ``buffers``: the tensors that are module buffers rather than parameters
    (BatchNorm running statistics; filled by :func:`modeconn.symmetry_spec`): every element moves them like the
    parameters, but weight matching does not score them (:func:`modeconn.match.weight.scored_keys`).
    """

    spaces: Mapping[str, Space]
    tensors: Mapping[str, tuple[AxisBinding, ...]]
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    probes: Mapping[str, tuple[Probe, ...]] = field(default_factory=dict)
    repair_points: tuple[tuple, ...] = ()  # (module, channel dim) or (module, dim, reader): see modeconn.path.repair
    aliases: Mapping[str, str] = field(default_factory=dict)
    buffers: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self._check_spaces()
        self._check_bindings()
        self._check_no_overlap()
        self._check_aliases()
        unknown = sorted(self.buffers - set(self.tensors))
        if unknown:
            raise SpecError(f"buffers {unknown} are not tensors of the spec")

    def _check_spaces(self) -> None:
        """Every space's group exists; a child's parent is a parent-less permutation of its size; children are
        unit-wise."""
        for s, sp in self.spaces.items():
            try:
                group = self.group_of(s)
            except (ConfigError, SpecError) as e:
                raise SpecError(f"space {s!r}: {e}") from None
            if sp.parent is not None:
                parent = self.spaces.get(sp.parent)
                if parent is None:
                    raise SpecError(f"space {s!r} has unknown parent space {sp.parent!r}")
                pg = self.group_of(sp.parent)
                if not pg.exact or pg.unitwise or parent.parent is not None:
                    raise SpecError(
                        f"space {s!r}: its parent {sp.parent!r} must be a permutation space without a parent "
                        f"(got group {parent.group!r})"
                    )
                if parent.size != sp.size:
                    raise SpecError(f"space {s!r} has {sp.size} units but its parent {sp.parent!r} has {parent.size}")
                if not group.unitwise:
                    raise SpecError(
                        f"space {s!r}: group {sp.group!r} acts on the whole space, it cannot be the child of a "
                        "permutation (only unit-wise groups: scaling, head_orthogonal, head_invertible)"
                    )

    def _check_bindings(self) -> None:
        """Every binding names a known space and side, has a valid block/offset/stride, and ``block = dim`` on
        per-head groups."""
        for key, binds in self.tensors.items():
            for b in binds:
                if b.space not in self.spaces:
                    raise SpecError(f"tensor {key!r} axis {b.axis} is bound to unknown space {b.space!r}")
                if b.side not in ("out", "in"):
                    raise SpecError(f"tensor {key!r} axis {b.axis}: side must be 'out' or 'in', got {b.side!r}")
                if b.unit_axis is not None:
                    self._check_unit_axis(key, b)
                elif b.block < 1 or b.offset < 0 or b.step < b.block:
                    raise SpecError(
                        f"tensor {key!r} axis {b.axis} (space {b.space!r}): need block ≥ 1, offset ≥ 0 and "
                        f"stride ≥ block, got block={b.block}, offset={b.offset}, stride={b.stride}"
                    )
                group = self.group_of(b.space)
                if getattr(group, "dim", None) is not None and b.block != group.dim:
                    raise SpecError(
                        f"tensor {key!r} axis {b.axis}: space {b.space!r} ({self.spaces[b.space].group}, dim={group.dim}) "
                        f"needs block = dim (one head per unit), got block={b.block}"
                    )

    def _check_unit_axis(self, key: str, b: AxisBinding) -> None:
        """A ``unit_axis`` binding: a child space, another axis, a block and no stride."""
        if self.spaces[b.space].parent is None or b.unit_axis == b.axis or b.unit_axis < 0 or b.stride is not None \
                or b.block < 1 or b.offset < 0:
            raise SpecError(
                f"tensor {key!r} axis {b.axis} (space {b.space!r}): a binding with unit_axis={b.unit_axis} must be of a "
                "child space, on another axis, with block ≥ 1, offset ≥ 0 and no stride"
            )

    def _check_aliases(self) -> None:
        """SpecError naming both keys for an alias whose primary the spec does not list (or is an alias itself), an
        alias missing from ``tensors``, or an alias bound differently from its primary (bindings of its own)."""
        for a, p in self.aliases.items():
            if p not in self.tensors or p in self.aliases or p == a:
                raise SpecError(
                    f"tied tensor {a!r} is an alias of {p!r}, which the spec does not list as a primary tensor "
                    "(missing, the alias itself, or another alias)"
                )
            if a not in self.tensors:
                raise SpecError(f"tied tensor {a!r} (alias of {p!r}) is not listed in the spec's tensors")
            if self.tensors[a]:
                raise SpecError(
                    f"tied tensor {a!r} (alias of {p!r}) is bound differently from its primary: it must not carry "
                    f"bindings of its own (got {list(self.tensors[a])}); the alias takes the primary's transform"
                )

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_axes(
        cls,
        spaces: Mapping[str, int] | Iterable[Space],
        axes: Mapping[str, tuple] | Iterable[tuple[str, tuple]],
        group: str = "permutation",
    ) -> SymmetrySpec:
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

    @cached_property
    def _groups(self) -> dict[str, Group]:
        return {}

    def group_of(self, space: str) -> Group:
        """The group instance acting on ``space`` (built once from its name and params)."""
        cache = self._groups
        if space not in cache:
            sp = self.spaces[space]
            cache[space] = get_group(sp.group, **dict(sp.params))
        return cache[space]

    @cached_property
    def children(self) -> dict[str, tuple[str, ...]]:
        """space name → the names of its child spaces (empty for most spaces)."""
        out: dict[str, list[str]] = {s: [] for s in self.spaces}
        for s, sp in self.spaces.items():
            if sp.parent is not None:
                out[sp.parent].append(s)
        return {s: tuple(v) for s, v in out.items()}

    def primary_of(self, key: str) -> str:
        """The key whose bindings act on ``key``: its primary for a tied alias, else ``key`` itself."""
        return self.aliases.get(key, key)

    def aliases_in(self, keys) -> dict[str, str]:
        """The aliases (alias → primary) with both keys in ``keys`` (a state dict or any container of names)."""
        return {a: p for a, p in self.aliases.items() if a in keys and p in keys}

    def check_tied(self, state_dict: StateDict, what: str = "state dict") -> None:
        """SpecError unless every alias present in ``state_dict`` with its primary equals it (same storage or
        equal values). ``state_dict``: any mapping (a lazy checkpoint reads only the tied tensors)."""
        for a, p in self.aliases_in(state_dict).items():
            ta, tp = state_dict[a], state_dict[p]
            if ta is tp or (ta.shape == tp.shape and storage_key(ta) == storage_key(tp)):
                continue
            if ta.shape != tp.shape or not torch.equal(ta, tp):
                raise SpecError(
                    f"{what}: {a!r} is tied to {p!r} in the spec but the two tensors differ; "
                    "untie them in the model and rebuild the spec"
                )

    def _complete(self, state_dict: StateDict) -> StateDict:
        """``state_dict`` with every missing alias filled in by its primary (a stored checkpoint keeps one key)."""
        missing = {a: p for a, p in self.aliases.items() if a not in state_dict and p in state_dict}
        if not missing:
            return state_dict
        full = dict(state_dict)
        full.update({a: state_dict[p] for a, p in missing.items()})
        return full

    @cached_property
    def _ordered(self) -> dict[str, tuple[AxisBinding, ...]]:
        """Bindings of each tensor in application order: independent/parent spaces first, then children."""
        return {
            key: tuple(b for b in binds if self.spaces[b.space].parent is None)
            + tuple(b for b in binds if self.spaces[b.space].parent is not None)
            for key, binds in self.tensors.items()
        }

    @cached_property
    def _plan(self) -> dict[str, tuple[tuple[AxisBinding, int, Group], ...]]:
        """tensor → (binding, space size, group) in application order."""
        return {
            key: tuple((b, self.spaces[b.space].size, self.group_of(b.space)) for b in binds)
            for key, binds in self._ordered.items()
        }

    @cached_property
    def _exact(self) -> dict[str, bool]:
        return {s: self.group_of(s).exact for s in self.spaces}

    @cached_property
    def _all_exact(self) -> dict[str, bool]:
        """tensor → whether only exact (permutation) groups act on it: no dtype promotion, no arithmetic."""
        return {key: all(self._exact[b.space] for b in binds) for key, binds in self.tensors.items()}

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
        """``g^{-1}`` (space by space; a child space ``c`` of ``p`` gets ``inverse(g[c])[inverse(g[p])]``)."""
        self.check_element(g)
        out = {s: self.group_of(s).inverse(g[s]) for s in self.spaces}
        for s, sp in self.spaces.items():
            if sp.parent is not None:
                out[s] = self.group_of(s).permute_units(out[s], out[sp.parent])
        return out

    def compose(self, g: Element, h: Element) -> Element:
        """``g∘h``, i.e. ``apply(θ, compose(g, h)) == apply(apply(θ, h), g)``. A child space ``c`` of ``p``
        gets ``compose(g[c], h[c][g[p]])`` (the semidirect product)."""
        self.check_element(g)
        self.check_element(h)
        out = {}
        for s, sp in self.spaces.items():
            group = self.group_of(s)
            hs = h[s] if sp.parent is None else group.permute_units(h[s], g[sp.parent])
            out[s] = group.compose(g[s], hs)
        return out

    def equal(self, g: Element, h: Element) -> bool:
        """Whether two elements agree on every space (exactly for permutations; ``allclose`` with
        ``rtol = 1e-4``, ``atol = 1e-4·max(1, max|h|)`` for continuous groups)."""
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
        The input is never mutated. Permutations are exact in any dtype; a tensor touched by a continuous
        group is computed in fp32 (fp64 if it is fp64) and cast back to its dtype once. A tied alias is the
        same object as its transformed primary (an alias missing from ``state_dict`` stays missing).

        Raises: :class:`StateDictMismatchError` if keys or shapes differ from the spec (names the keys and
        both shapes); :class:`SpecError` if ``g`` is not a valid element or tied tensors differ.
        """
        self.check_state_dict(state_dict)
        self.check_element(g)
        self.check_tied(state_dict)
        tied = self.aliases_in(state_dict)
        cache: dict = {}
        out = {key: self.apply_tensor(key, t, g, cache=cache) for key, t in state_dict.items() if key not in tied}
        for alias, primary in tied.items():
            out[alias] = out[primary]
        from .._util.statedict import with_metadata

        return with_metadata({key: out[key] for key in state_dict}, state_dict)

    def apply_tensor(
        self,
        key: str,
        t: torch.Tensor,
        g: Element,
        skip: AxisBinding | Iterable[AxisBinding] | None = None,
        cache: dict | None = None,
    ) -> torch.Tensor:
        """Act with ``g`` on the single tensor ``key`` (all its bindings except ``skip``: one binding or a
        collection, compared by identity). Parents act before their children. ``cache``: a dict shared by
        the calls of one ``apply`` (keeps derived matrices such as inverses). Raises SpecError if a
        continuous group would act on a non-floating tensor.

        Several permutation bindings of one tensor (no child spaces) are fused into one index gather per axis
        (:meth:`permutation_gathers`): transformer specs bind many per-head spaces to one tensor (a fused QKV
        weight carries ~3·heads bindings), and one full copy per binding made ``apply`` and weight matching on a
        160M model take minutes. Bindings of one axis are disjoint, so the fused gather equals the sequential
        one exactly."""
        plan = self._plan[key]
        if skip is not None:
            skips = _skips(skip)
            plan = [p for p in plan if not any(p[0] is x for x in skips)]
        if len(plan) >= 2:
            gathers = self.permutation_gathers(key, t.shape, g, skip, t.device)
            if gathers is not None:
                return apply_gathers(t, gathers)
        if self._all_exact[key]:
            for b, n, group in plan:
                t = _act_on_binding(t, b, g[b.space], n, group)
            return t
        if not t.is_floating_point():
            raise SpecError(f"tensor {key!r} ({t.dtype}) is bound to a continuous group; only floating tensors can be")
        dtype = t.dtype
        t = t.to(compute_dtype(dtype))
        for b, n, group in plan:
            t = _act_on_binding(t, b, g[b.space], n, group, cache)
        return t.to(dtype)

    def permutation_gathers(
        self,
        key: str,
        shape: tuple[int, ...] | torch.Size,
        g: Element,
        skip: AxisBinding | Iterable[AxisBinding] | None = None,
        device: torch.device | str | None = None,
    ) -> dict[int, torch.Tensor] | None:
        """``g`` on tensor ``key`` (of ``shape``; bindings except ``skip``) as one index gather per axis:
        ``{axis: index}`` (LongTensor of the axis length) with ``apply_tensor(key, t, g, skip) ==
        t.index_select(a0, index_0).index_select(a1, index_1)…`` exactly, in any dtype and in any order of the
        axes. ``None`` if a non-permutation group or a child space acts on the tensor (use :meth:`apply_tensor`).
        Bindings of one axis are disjoint, so fusing them into one gather equals acting with them in turn; a
        gather restricted to a slice of one axis (``index[i0:i1]``) gives that slice of ``g·t`` without forming
        the rest, which is how streaming weight matching reads large tensors chunk by chunk."""
        binds = self.tensors[key]
        if skip is not None:
            skips = _skips(skip)
            binds = tuple(b for b in binds if not any(b is x for x in skips))
        if not all(self._exact[b.space] and self.spaces[b.space].parent is None and not self.group_of(b.space).unitwise
                   for b in binds):
            return None
        out: dict[int, torch.Tensor] = {}
        for b in binds:
            if b.axis not in out:
                out[b.axis] = torch.arange(shape[b.axis], device=device)
            n = self.spaces[b.space].size
            pos = b.indices(n, device).reshape(n, b.block)
            out[b.axis][pos.reshape(-1)] = pos[g[b.space].to(pos.device)].reshape(-1)
        return out

    # ------------------------------------------------------------------ validation
    def check_state_dict(self, state_dict: StateDict, what: str = "state dict") -> None:
        """StateDictMismatchError listing missing/unexpected keys and shape mismatches (cheap: no math). A missing
        tied alias is fine (its primary stands for it)."""
        state_dict = self._complete(state_dict)
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
        tensor that is unbound, bound twice or bound with the wrong size, a space no tensor writes, or a
        non-floating tensor bound to a continuous group. A child space's bindings nested inside its parent's
        (heads ⋉ per-head transforms) are not "bound twice"; that nesting, the parent's group, the sizes and
        ``block = dim`` of head groups are checked when the spec is built, and so are the aliases (an alias whose
        primary is missing or that is bound differently). Tied tensors: a missing alias stands for its primary;
        an alias present without its primary, or whose values differ from it, is a SpecError naming both keys.
        """
        sd = (
            model_or_state_dict.state_dict()
            if isinstance(model_or_state_dict, torch.nn.Module)
            else model_or_state_dict
        )
        orphans = {a: p for a, p in self.aliases.items() if a in sd and p not in sd}
        if orphans:
            a, p = next(iter(orphans.items()))
            raise SpecError(f"tied tensor {a!r} is in the model but its primary {p!r} is not (spec from another model?)")
        full = self._complete(sd)
        self._check_keys(full)
        for s, binds in self.bindings_by_space.items():
            if not any(b.side == "out" for _, b in binds):
                raise SpecError(f"space {s!r} has no output-side (writer) tensor; bindings: {[k for k, _ in binds]}")
        # float tensors only where continuous groups act
        for key, binds in self.tensors.items():
            if not full[key].is_floating_point():
                cont = [b.space for b in binds if not self._exact[b.space]]
                if cont:
                    raise SpecError(f"tensor {key!r} ({full[key].dtype}) is bound to continuous spaces {cont}")
        self.check_tied(sd)

    def _check_keys(self, sd: StateDict) -> None:
        """SpecError for a tensor the spec does not list, a listed tensor ``sd`` lacks, or a shape that does not fit."""
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

    def _shape_problems(self, key: str, shape: tuple[int, ...]) -> list[str]:
        problems = []
        expected = self.shapes.get(key)
        if expected is not None and tuple(expected) != shape:
            problems.append(f"tensor {key!r}: shape {shape} but the spec expects {tuple(expected)}")
        for b in self.tensors[key]:
            if b.axis >= len(shape):
                problems.append(f"tensor {key!r} has {len(shape)} axes but axis {b.axis} is bound to {b.space!r}")
                continue
            n = self.spaces[b.space].size
            if b.unit_axis is not None:
                if b.unit_axis >= len(shape) or shape[b.unit_axis] != n or b.span(n) > shape[b.axis]:
                    problems.append(
                        f"tensor {key!r} (shape {shape}): space {b.space!r} needs {n} units along axis {b.unit_axis} "
                        f"and entries [{b.offset}, {b.span(n)}) of axis {b.axis}"
                    )
            elif b.step == b.block:
                end = b.offset + n * b.block
                if end > shape[b.axis] or (end != shape[b.axis] and b.offset == 0 and not b.partial):
                    problems.append(
                        f"tensor {key!r} axis {b.axis} has size {shape[b.axis]} but space {b.space!r} "
                        f"(size {n}, block {b.block}, offset {b.offset}) needs {end}"
                    )
            elif b.span(n) > shape[b.axis] or (n * b.step != shape[b.axis] and not b.partial):
                problems.append(
                    f"tensor {key!r} axis {b.axis} has size {shape[b.axis]} but space {b.space!r} (size {n}, "
                    f"block {b.block}, offset {b.offset}, stride {b.step}) needs {n * b.step} (reaches {b.span(n)})"
                )
        return problems

    def _check_no_overlap(self) -> None:
        """Bindings of one axis may not overlap, except a child inside its parent: every child binding must
        lie, unit by unit, inside a binding of its parent on the same axis (same stride)."""
        for key, binds in self.tensors.items():
            by_axis: dict[int, list[AxisBinding]] = {}
            for b in binds:
                by_axis.setdefault(b.axis, []).append(b)
            for axis, bs in by_axis.items():
                roots = [b for b in bs if self.spaces[b.space].parent is None]
                kids = [b for b in bs if self.spaces[b.space].parent is not None]
                self._disjoint(key, axis, roots)
                self._disjoint(key, axis, kids)
                for c in kids:
                    parent = self.spaces[c.space].parent
                    if c.unit_axis is not None:
                        self._check_unit_parent(key, c, parent)
                        continue
                    if not any(
                        p.space == parent and p.step == c.step and p.offset <= c.offset
                        and c.offset + c.block <= p.offset + p.block
                        for p in roots
                    ):
                        raise SpecError(
                            f"tensor {key!r} axis {axis}: the binding of {c.space!r} (block {c.block}, offset "
                            f"{c.offset}, stride {c.step}) is not inside a binding of its parent {parent!r} — its "
                            "units would be transformed without being moved by the parent permutation"
                        )

    def _check_unit_parent(self, key: str, c: AxisBinding, parent: str) -> None:
        """A ``unit_axis`` child binding needs its parent on ``unit_axis``, one whole unit per index."""
        if not any(p.space == parent and p.axis == c.unit_axis and p.block == 1 and p.offset == 0 and p.step == 1
                   for p in self.tensors[key]):
            raise SpecError(
                f"tensor {key!r}: the binding of {c.space!r} (axis {c.axis}, units along axis {c.unit_axis}) needs its "
                f"parent {parent!r} bound to axis {c.unit_axis} with block 1 — its units would be transformed without "
                "being moved by the parent permutation"
            )

    def _disjoint(self, key: str, axis: int, bs: list[AxisBinding]) -> None:
        if len(bs) < 2:
            return
        size = {b: self.spaces[b.space].size for b in bs}
        if all(b.step == b.block or b.unit_axis is not None for b in bs):
            spans = sorted((b.offset, b.span(size[b]), b.space) for b in bs)
            for (s0, e0, n0), (s1, _e1, n1) in zip(spans, spans[1:], strict=False):
                if s1 < e0:
                    raise SpecError(f"tensor {key!r} axis {axis} is bound twice (spaces {n0!r} and {n1!r} overlap)")
            return
        owner = torch.full((max(b.span(size[b]) for b in bs),), -1, dtype=torch.long)
        for i, b in enumerate(bs):
            idx = b.indices(size[b])
            taken = owner[idx]
            if (taken >= 0).any():
                other = bs[int(taken[taken >= 0][0])].space
                raise SpecError(f"tensor {key!r} axis {axis} is bound twice (spaces {other!r} and {b.space!r} overlap)")
            owner[idx] = i

    # ------------------------------------------------------------------ misc
    def __repr__(self) -> str:
        bound = sum(1 for b in self.tensors.values() if b)
        return f"SymmetrySpec({len(self.spaces)} spaces, {bound}/{len(self.tensors)} tensors bound)"

    def summary(self) -> str:
        """A human-readable table: each space, its size, group and the tensors it binds."""
        lines = []
        for s, sp in self.spaces.items():
            keys = ", ".join(f"{k}[{b.axis}{'' if b.side == 'out' else '*'}]" for k, b in self.bindings_by_space[s])
            extra = "".join(f", {k}={v}" for k, v in sp.params) + (f", parent={sp.parent}" if sp.parent else "")
            lines.append(f"{s} ({sp.group}, n={sp.size}{extra}): {keys}")
        return "\n".join(lines)


def storage_key(t: torch.Tensor) -> tuple:
    """Identifies the memory ``t`` views: ``(device, data pointer)``; on the meta device, where every data pointer
    is 0, the storage object itself (tied parameters of a model built on the meta device share one storage)."""
    return (t.device, t.untyped_storage()._cdata if t.is_meta else t.data_ptr())


def apply_gathers(t: torch.Tensor, gathers: Mapping[int, torch.Tensor]) -> torch.Tensor:
    """``t`` gathered along every axis of ``gathers`` (``{axis: index}``, as :meth:`SymmetrySpec.permutation_gathers`
    returns), in axis order."""
    for axis in sorted(gathers):
        t = t.index_select(axis, gathers[axis])
    return t


def _skips(skip: AxisBinding | Iterable[AxisBinding]) -> tuple[AxisBinding, ...]:
    """``skip`` of :meth:`SymmetrySpec.apply_tensor` as a tuple (bindings are compared by identity)."""
    return (skip,) if isinstance(skip, AxisBinding) else tuple(skip)


def _parse_axis(axis: int, entry: str | AxisBinding) -> AxisBinding:
    if isinstance(entry, AxisBinding):
        if entry.axis != axis:
            raise SpecError(f"AxisBinding for space {entry.space!r} says axis {entry.axis} but stands at position {axis}")
        return entry
    if isinstance(entry, str):
        return AxisBinding(axis, entry, "out" if axis == 0 else "in")
    raise SpecError(f"axis {axis}: expected None, a space name or an AxisBinding, got {entry!r}")


def _act_on_binding(t: torch.Tensor, b: AxisBinding, g: torch.Tensor, n: int, group, cache=None) -> torch.Tensor:
    kw = {} if cache is None else {"cache": cache}
    if b.unit_axis is not None:  # unit i: index i of unit_axis, its entries [offset, offset + block) of axis
        part = t.narrow(b.axis, b.offset, b.block).movedim((b.unit_axis, b.axis), (0, 1))
        acted = group.act(part.reshape(n * b.block, -1), 0, g, b.side, b.block, **kw)
        acted = acted.reshape(part.shape).movedim((0, 1), (b.unit_axis, b.axis))
        return t.index_copy(b.axis, b.indices(n, t.device), acted)
    length = n * b.block
    if b.step != b.block:
        idx = b.indices(n, t.device)
        return t.index_copy(b.axis, idx, group.act(t.index_select(b.axis, idx), b.axis, g, b.side, b.block, **kw))
    if b.offset == 0 and t.shape[b.axis] == length:
        return group.act(t, b.axis, g, b.side, b.block, **kw)
    before, part, after = t.split([b.offset, length, t.shape[b.axis] - b.offset - length], dim=b.axis)
    return torch.cat([before, group.act(part, b.axis, g, b.side, b.block, **kw), after], dim=b.axis)
