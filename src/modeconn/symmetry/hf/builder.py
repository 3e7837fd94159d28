"""Turn an adapter's :class:`~modeconn.symmetry.hf.structure.Structure` into a :class:`SymmetrySpec`.

Groups are requested per *role* (``d`` = head_dim, ``r`` = rotary dims, ``G`` = key/value heads of a layer):

============  ==========================================================================  =====================
role          spaces                                                                      groups
============  ==========================================================================  =====================
residual      one space of size d_model: every writer (out), norm params (out), every      **permutation**,
              reader (in); an encoder–decoder with an encoder stream of its own: a second orthogonal [1]
              space ``encoder.residual`` (its writers, norms, and readers incl. cross-attention K/V)
heads         one per layer, ``G`` units: whole key/value groups move (the Q rows and O    permutation,
              columns of every query head of a group, its K and V rows)                   **None**
qk            permutation: one space per K head and layer, size ``d − r``: the non-rotary  **permutation**,
              dims of K rows and of the Q rows of every query head sharing it (out).      head_orthogonal,
              head_*: one space per layer, ``G`` units of ``d`` dims (``rotary_dims=r``,    head_invertible
              pairs ``(i, i + r/2)``): Q rows out (``A``), K rows in (``A^{-T}``)
vo            permutation: one space per V head and layer, size ``d``; head_*: one space   **permutation**,
              per layer, ``G`` units of ``d``. V rows out, O columns of every query head   head_orthogonal,
              of the group in                                                              head_invertible
ffn           one per FFN, size d_ff: up/gate rows (out), down columns (in)               **permutation**
experts       one per Mixture-of-Experts layer, ``E`` units: router rows (out), the expert   **permutation**
              axis of the stacked banks; the hidden units inside each expert follow the
              ffn role: a ``block_permutation`` child (one permutation of ``I`` per expert,
              bound with ``unit_axis`` = the bank's expert axis)
ffn_scale     one per FFN, size d_ff: the linear branch (``up`` of a GLU, or ``up`` of a   scaling, **None**
              ReLU MLP) out, down columns in; child of the ffn permutation when both
hidden        one per extra hidden space (pooler read by a classifier)                    **permutation**
============  ==========================================================================  =====================

Bold: the default (``groups="permutation"`` sets every role whose default is a group to that group).
``None`` for a role leaves its tensors unbound (an ablation: e.g. ``{"qk": None}``). With ``heads`` active,
qk and vo must be ``head_*`` groups (or None): they become *child* spaces of the head permutation (the
wreath product of :mod:`modeconn.symmetry.spec`), whose bindings use ``stride`` to address one head per
unit inside a group of query heads or a fused QKV layout.
[1] only once the stream carries no normalisation parameters and only parameter-free RMS norms, i.e. after
:func:`modeconn.absorb_normalization` (SpecError otherwise).

Rotary dims and permutations: moving a rotary dim, or a whole RoPE pair, to another position changes its
frequency, so the permutation qk spaces leave the ``r`` rotary dims unbound; the ``head_*`` groups act on
them with scaled 2×2 rotations per pair (which commute with RoPE).

Extension point: a new group for a role goes into :data:`SUPPORTED` and, where its bindings differ, into
that role's ``_build_*`` function; everything it needs (slices per head, K/V sharing, rotary dims, GLU
branches, activation) is in the :class:`Structure`, so adapters do not change.

Tied tensors (GPT-2's ``wte``/``lm_head``): the *primary* key (the one with an output-side binding, else
the first) carries the bindings, the alias gets none, and :class:`HFSymmetrySpec` copies the primary's
transformed tensor into the alias (the same tensor object), so they stay tied and no objective counts
the matrix twice. Tying is only consistent for groups with ``g^{-T} = g`` (permutation, orthogonal) when
the two keys sit on different sides (an embedding writes the stream, a head reads it).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


from ...errors import ConfigError, SpecError, StateDictMismatchError
from ..groups import GROUPS
from ..spec import AxisBinding, Probe, Space, StateDict, SymmetrySpec, storage_key  # noqa: F401  (storage_key: re-export)
from .structure import Attention, Experts, KVHead, QueryHead, Slice, Structure

ROLES = ("residual", "heads", "qk", "vo", "ffn", "experts", "ffn_scale", "hidden")
SUPPORTED: dict[str, tuple[str, ...]] = {
    "residual": ("permutation", "orthogonal"),
    "heads": ("permutation",),
    "qk": ("permutation", "head_orthogonal", "head_invertible"),
    "vo": ("permutation", "head_orthogonal", "head_invertible"),
    "ffn": ("permutation",),
    "experts": ("permutation",),
    "ffn_scale": ("scaling",),
    "hidden": ("permutation",),
}
DEFAULTS: dict[str, str | None] = {
    "residual": "permutation", "heads": None, "qk": "permutation", "vo": "permutation", "ffn": "permutation",
    "experts": "permutation", "ffn_scale": None, "hidden": "permutation",
}
FULL_GROUPS: dict[str, str | None] = {
    "residual": "orthogonal", "heads": "permutation", "qk": "head_orthogonal", "vo": "head_orthogonal",
}
"""The full transformer group preset (``--groups full``), solved after normalization absorption: an orthogonal
residual rotation, head permutations with per-head orthogonal QK / OV maps, FFN permutations."""
_SELF_DUAL = {g for g in GROUPS if GROUPS.get(g).isometric}  # g^{-T} = g: both sides act alike
_HEAD_GROUPS = {g for g in GROUPS if GROUPS.get(g).per_head}
# positively homogeneous activations (f(s·x) = s·f(x) for s > 0): a non-GLU FFN can be rescaled per unit
_HOMOGENEOUS = {"relu", "leaky_relu", "identity", "linear"}

Groups = str | Mapping[str, str | None]


@dataclass(frozen=True, repr=False)
class HFSymmetrySpec(SymmetrySpec):
    """A :class:`SymmetrySpec` that knows the :class:`Structure` it was built from. Tied tensors (``aliases``: alias
    key → primary key), their checks and the fused permutation gathers are the IR's own
    (:class:`~modeconn.symmetry.spec.SymmetrySpec`). ``stacked``: for a spec of a checkpoint directory, the tensors
    it binds that the checkpoint stores split (Mixture-of-Experts banks stored per expert; model key → their
    :class:`modeconn.io.hf.Stacking`), which the streaming functions read through :mod:`modeconn.io.stacked`."""

    structure: Structure | None = field(default=None, compare=False, repr=False)
    stacked: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


def resolve_groups(groups: Groups) -> dict[str, str | None]:
    """``{role: group or None}`` for every role; ConfigError naming the role, group and the choices.

    A string sets every role whose default is a group (residual, qk, vo, ffn, hidden); a mapping overrides
    the defaults (:data:`DEFAULTS`) role by role.
    """
    if isinstance(groups, str):
        chosen: dict[str, str | None] = {r: (groups if d is not None else None) for r, d in DEFAULTS.items()}
    elif isinstance(groups, Mapping):
        unknown = [r for r in groups if r not in ROLES]
        if unknown:
            raise ConfigError(f"unknown symmetry roles {unknown}; roles: {list(ROLES)}")
        chosen = {r: groups.get(r, DEFAULTS[r]) for r in ROLES}
    else:
        raise ConfigError(f"groups must be a group name or a mapping role → group, got {groups!r}")
    for role, g in chosen.items():
        if g is None:
            continue
        if g not in SUPPORTED[role]:
            raise ConfigError(
                f"role {role!r} with group {g!r} is not supported by the Hugging Face spec builder "
                f"(supported for {role!r}: {list(SUPPORTED[role])}; None leaves the role unbound)"
            )
        if g not in GROUPS:
            raise ConfigError(f"group {g!r} (role {role!r}) is not registered; registered groups: {GROUPS.names()}")
    if chosen["heads"] is not None:
        flat = [r for r in ("qk", "vo") if chosen[r] is not None and chosen[r] not in _HEAD_GROUPS]
        if flat:
            raise ConfigError(
                f"with a head permutation the roles {flat} must use a per-head group ({sorted(_HEAD_GROUPS)}) or "
                "None: per-dimension permutation spaces cannot nest inside moving heads"
            )
    return chosen


class _Acc:
    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.shapes = shapes
        self.spaces: dict[str, Space] = {}
        self.binds: dict[str, list[AxisBinding]] = {k: [] for k in shapes}
        self.probes: dict[str, list[Probe]] = {}

    def space(self, name: str, size: int, group: str, parent: str | None = None, params: dict | None = None) -> str:
        if name in self.spaces:
            raise SpecError(f"adapter produced the space {name!r} twice")
        self.spaces[name] = Space(name, int(size), group, parent=parent, params=tuple(sorted((params or {}).items())))
        self.probes[name] = []
        return name

    def bind(self, slices: tuple[Slice, ...] | list[Slice], space: str, side: str) -> None:
        n = self.spaces[space].size
        for s in slices:
            shape = self.shapes.get(s.key)
            if shape is None:
                raise SpecError(f"adapter names tensor {s.key!r}, which is not in the state dict")
            if s.axis >= len(shape):
                raise SpecError(f"adapter binds axis {s.axis} of {s.key!r}, which has shape {shape}")
            size = shape[s.axis] - s.offset if s.size is None else s.size
            if size != n or s.offset + size > shape[s.axis]:
                raise SpecError(
                    f"adapter binds {s.key!r} axis {s.axis} [{s.offset}, {s.offset + size}) (shape {shape}) "
                    f"to space {space!r} of size {n}"
                )
            partial = s.offset != 0 or size != shape[s.axis]
            self.binds[s.key].append(AxisBinding(s.axis, space, side, 1, s.offset, partial))

    def bind_units(self, units: list[list[Slice]], space: str, side: str, merge: bool = False,
                   strides: dict[tuple[str, int], list[tuple[int, int, int]]] | None = None) -> None:
        """Bind ``units[j]`` (the slices of unit ``j``) as unit ``j`` of ``space``: per tensor axis and per run
        of slices (adjacent slices merged when ``merge``), one binding whose offsets advance by a constant
        stride from unit to unit. ``strides``: the parent's runs ``(offset, size, step)`` per tensor axis; a
        child binding takes the step of the parent run containing it (required by the spec's nesting check)."""
        for (key, axis), offset, size, step in _unit_runs(units, merge):
            if strides is not None:
                run = next(((o, n, st) for o, n, st in strides.get((key, axis), ()) if o <= offset and offset + size <= o + n), None)
                if run is None:
                    raise SpecError(f"{key!r} axis {axis} [{offset}, {offset + size}) of space {space!r} is outside the head units")
                if len(units) > 1 and step != run[2]:
                    raise SpecError(f"{key!r} axis {axis}: space {space!r} advances by {step} per unit, its parent by {run[2]}")
                step = run[2]
            if key not in self.shapes:
                raise SpecError(f"adapter names tensor {key!r}, which is not in the state dict")
            self.binds[key].append(AxisBinding(axis, space, side, size, offset, True, None if step == size else step))

    def bind_within(self, slices: tuple[Slice, ...], space: str, side: str, unit_axis: Callable[[str], int]) -> None:
        """Bind each slice as the same entries of every unit of the child ``space``, whose units lie along
        ``unit_axis(key)`` (:class:`~modeconn.symmetry.spec.AxisBinding`'s ``unit_axis``)."""
        for s in slices:
            if s.key not in self.shapes:
                raise SpecError(f"adapter names tensor {s.key!r}, which is not in the state dict")
            self.binds[s.key].append(AxisBinding(s.axis, space, side, s.size, s.offset, True, None, unit_axis(s.key)))

    def probe(self, space: str, module: str, where: str, offset: int = 0, block: int = 1) -> None:
        self.probes[space].append(Probe(module, where, -1, offset, block))


def _module_of(key: str) -> str:
    return key.rsplit(".", 1)[0]


def _dual_side(group: str) -> str:
    """The side of the K rows in a QK space: the same as Q for g^{-T} = g, else the dual (input) side."""
    return "out" if group in _SELF_DUAL else "in"


def _build_residual(acc: _Acc, st: Structure, group: str, permute_outputs: bool) -> None:
    _build_stream(acc, st.stream, "residual", group, permute_outputs)
    if st.encoder_stream is not None:
        _build_stream(acc, st.encoder_stream, "encoder.residual", group, permute_outputs)


def _build_stream(acc: _Acc, s, name: str, group: str, permute_outputs: bool) -> None:
    if s.is_output and not permute_outputs:
        return  # the stream is the model's output: acting on it would change the output
    if not GROUPS.get(group).exact:  # a continuous stream transform (orthogonal) commutes with scale-free RMS norms only
        bad = [n.path for n in s.norms if n.kind != "rms" or n.params()]
        if s.post_norm or bad:
            raise SpecError(
                "an orthogonal residual stream needs parameter-free RMS norms on a pre-norm model; "
                f"{'the model is post-norm' if s.post_norm else f'norms {bad} carry parameters or subtract the mean'}"
                " — run modeconn.absorb_normalization(model) first"
            )
    name = acc.space(name, s.size, group)
    acc.bind(s.writers, name, "out")
    acc.bind([p for n in s.norms for p in n.params()], name, "out")
    acc.bind(s.readers, name, "in")
    for n in s.norms:
        acc.probe(name, n.path, "input")


def _unit_runs(units: list[list[Slice]], merge: bool) -> list[tuple[tuple[str, int], int, int, int]]:
    """Per tensor axis and run: ``((key, axis), offset of unit 0, run size, step between units)``."""
    per_unit = []
    for u in units:
        runs: dict[tuple[str, int], list[list[int]]] = {}
        for sl in sorted(u, key=lambda x: (x.key, x.axis, x.offset)):
            if sl.size is None:
                raise SpecError(f"a head slice of {sl.key!r} needs an explicit size")
            lst = runs.setdefault((sl.key, sl.axis), [])
            if merge and lst and lst[-1][0] + lst[-1][1] == sl.offset:
                lst[-1][1] += sl.size
            else:
                lst.append([sl.offset, sl.size])
        per_unit.append(runs)
    out = []
    for ka, runs0 in per_unit[0].items():
        for r, (off0, size) in enumerate(runs0):
            offs = []
            for j, runs in enumerate(per_unit):
                lst = runs.get(ka, [])
                if len(lst) != len(runs0) or lst[r][1] != size:
                    raise SpecError(f"{ka[0]!r} axis {ka[1]}: head unit {j} is laid out unlike unit 0")
                offs.append(lst[r][0])
            step = offs[1] - offs[0] if len(offs) > 1 else size
            if any(b - a != step for a, b in itertools.pairwise(offs)) or step < size:
                raise SpecError(f"{ka[0]!r} axis {ka[1]}: head units at offsets {offs} are not equally spaced")
            out.append((ka, off0, size, step))
    return out


_Groups = list[tuple[KVHead, list[QueryHead]]]  # per key/value head: (it, the query heads sharing it)
_Strides = dict[tuple[str, int], list[tuple[int, int, int]]]


def _restrict(a: Attention, role: str, group: str | None) -> str | None:
    """``group`` unless the layer declares the role frozen, or permutation-only and ``group`` is continuous."""
    if group is None or role in a.frozen_roles:
        return None
    if role in a.permutation_only and group in _HEAD_GROUPS:
        return None
    return group


def _build_attention(acc: _Acc, a: Attention, heads: str | None, qk: str | None, vo: str | None) -> None:
    heads, qk, vo = _restrict(a, "heads", heads), _restrict(a, "qk", qk), _restrict(a, "vo", vo)
    groups = [(kv, [a.heads[i] for i in kv.queries]) for kv in a.kv_heads]
    parent, strides = _build_heads(acc, a, groups, heads) if heads is not None else (None, None)
    if qk in _HEAD_GROUPS:
        _build_qk_heads(acc, a, groups, qk, parent, strides)
    elif qk is not None and a.head_dim - a.rotary_dims > 0:
        _build_qk_perms(acc, a, groups, qk)
    if vo in _HEAD_GROUPS:
        _build_vo_heads(acc, a, groups, vo, parent, strides)
    elif vo is not None:
        _build_vo_perms(acc, a, groups, vo)


def _build_heads(acc: _Acc, a: Attention, groups: _Groups, heads: str) -> tuple[str, _Strides]:
    """Whole key/value groups move: Q rows, K/V rows (out), O columns (in). Returns the head space and its runs
    per tensor axis (the strides its child spaces must follow)."""
    parent = acc.space(f"{a.path}.heads", len(groups), heads)
    writers = [[*(s for h in qs for s in (*h.q, *h.extra)), *kv.k, *kv.v] for kv, qs in groups]
    readers = [[s for h in qs for s in h.o] for kv, qs in groups]
    acc.bind_units(writers, parent, "out", merge=True)
    acc.bind_units(readers, parent, "in", merge=True)
    strides: _Strides = {}
    for ka, off, size, step in _unit_runs(writers, True) + _unit_runs(readers, True):
        strides.setdefault(ka, []).append((off, size, step))
    o0 = groups[0][1][0].o[0]
    acc.probe(parent, _module_of(o0.key), "input", o0.offset, len(groups[0][1]) * a.v_dim)
    return parent, strides


def _build_qk_heads(acc: _Acc, a: Attention, groups: _Groups, qk: str, parent: str | None,
                    strides: _Strides | None) -> None:
    """One QK space per layer, a unit per key/value head: Q rows out, K rows on the group's dual side."""
    name = acc.space(f"{a.path}.qk", len(groups), qk, parent,
                     {"dim": a.head_dim, "rotary_dims": a.rotary_dims, "rotary_pairing": a.rotary_style or "half"})
    acc.bind_units([[s for h in qs for s in h.q] for _, qs in groups], name, "out", strides=strides)
    acc.bind_units([list(kv.k) for kv, _ in groups], name, _dual_side(qk), strides=strides)


def _build_qk_perms(acc: _Acc, a: Attention, groups: _Groups, qk: str) -> None:
    """One QK space per key/value head over its non-rotary dims."""
    hd, rot = a.head_dim, a.rotary_dims
    for j, (kv, qs) in enumerate(groups):
        name = acc.space(f"{a.path}.qk{j}", hd - rot, qk)
        acc.bind([s.sub(rot, hd - rot) for h in qs for s in h.q], name, "out")
        acc.bind([s.sub(rot, hd - rot) for s in kv.k], name, _dual_side(qk))
        q0 = qs[0].q[0]
        acc.probe(name, _module_of(q0.key), "output", q0.offset + rot)


def _build_vo_heads(acc: _Acc, a: Attention, groups: _Groups, vo: str, parent: str | None,
                    strides: _Strides | None) -> None:
    """One VO space per layer, a unit per key/value head: V rows out, O columns of its query heads in."""
    name = acc.space(f"{a.path}.vo", len(groups), vo, parent, {"dim": a.v_dim})
    acc.bind_units([list(kv.v) for kv, _ in groups], name, "out", strides=strides)
    acc.bind_units([[s for h in qs for s in h.o] for _, qs in groups], name, "in", strides=strides)


def _build_vo_perms(acc: _Acc, a: Attention, groups: _Groups, vo: str) -> None:
    """One VO space per key/value head, of size head_dim."""
    for j, (kv, qs) in enumerate(groups):
        name = acc.space(f"{a.path}.vo{j}", a.v_dim, vo)
        acc.bind(kv.v, name, "out")
        acc.bind([s for h in qs for s in h.o], name, "in")
        for h in qs:
            acc.probe(name, _module_of(h.o[0].key), "input", h.o[0].offset)


def _build_ffn(acc: _Acc, f, perm: str | None, scale: str | None) -> None:
    parent = None
    if perm is not None:
        parent = acc.space(f"{f.path}.ffn", f.size, perm)
        acc.bind([*f.up, *f.gate], parent, "out")
        acc.bind(f.down, parent, "in")
        acc.probe(parent, _module_of(f.down[0].key), "input")
    if scale is not None:
        act = f.activation.lower()
        if not f.gate and act not in _HOMOGENEOUS:
            raise SpecError(
                f"{f.path}: per-unit scaling needs a GLU (scale the linear branch) or a positively homogeneous "
                f"activation ({sorted(_HOMOGENEOUS)}); this FFN applies {f.activation!r} to its only branch"
            )
        name = acc.space(f"{f.path}.ffn_scale", f.size, scale, parent)
        acc.bind(f.up, name, "out")
        acc.bind(f.down, name, "in")


def _build_experts(acc: _Acc, e: Experts, experts: str, ffn: str | None) -> None:
    """Experts move with their router rows; with an FFN group, each expert's hidden units move on their own."""
    parent = acc.space(f"{e.path}.experts", e.count, experts)
    acc.bind(e.router, parent, "out")
    for sl, side in e.banks:
        acc.bind((sl,), parent, side)
    if ffn is not None:
        child = acc.space(f"{e.path}.expert_ffn", e.count, "block_permutation", parent, {"dim": e.size})
        acc.bind_within((*e.gate, *e.up), child, "out", e.expert_axis)
        acc.bind_within(e.down, child, "in", e.expert_axis)


def build_spec(
    structure: Structure,
    state_dict: StateDict,
    groups: Groups = "permutation",
    *,
    permute_outputs: bool = False,
) -> HFSymmetrySpec:
    """The :class:`HFSymmetrySpec` of ``structure`` for the requested groups (see the module docstring).

    Args:
        structure: from :func:`modeconn.symmetry.hf.describe`.
        state_dict: the model's state dict (keys and shapes; aliases are detected by the adapter).
        groups: one group name for every role, or ``{role: group or None}`` (missing roles: permutation).
        permute_outputs: act on the residual stream even where it is the model output (a base model's
            ``last_hidden_state``); the output is then permuted too (``f(g·θ) = g·f(θ)``), not invariant.
    Raises: ConfigError (unknown role/group, group not registered), SpecError (a tensor the adapter does
        not know, a slice that does not fit, tied tensors bound to different spaces, an orthogonal stream
        before absorption).
    """
    chosen = resolve_groups(groups)
    shapes = {k: tuple(t.shape) for k, t in state_dict.items()}
    acc = _Acc(shapes)
    if chosen["residual"] is not None:
        _build_residual(acc, structure, chosen["residual"], permute_outputs)
    for a in structure.attentions:
        _build_attention(acc, a, chosen["heads"], chosen["qk"], chosen["vo"])
    for f in structure.ffns:
        _build_ffn(acc, f, chosen["ffn"], chosen["ffn_scale"])
    if chosen["experts"] is not None:
        for e in structure.experts:
            _build_experts(acc, e, chosen["experts"], chosen["ffn"])
    for h in structure.hidden:
        if h.joins_stream:  # tied to the stream's transform: bound with it, or frozen with it
            if "residual" in acc.spaces:
                acc.bind([*h.writers, *h.norms], "residual", "out")
                acc.bind(h.readers, "residual", "in")
        elif chosen["hidden"] is not None:
            name = acc.space(h.name, h.size, chosen["hidden"])
            acc.bind([*h.writers, *h.norms], name, "out")
            acc.bind(h.readers, name, "in")
            acc.probe(name, *(h.probe or (_module_of(h.readers[0].key), "input")))

    _check_coverage(structure, shapes)
    tensors = {k: tuple(v) for k, v in acc.binds.items()}
    aliases = _resolve_aliases(structure, tensors, acc.spaces)
    spec = HFSymmetrySpec(
        spaces=acc.spaces,
        tensors=tensors,
        shapes=shapes,
        probes={k: tuple(v) for k, v in acc.probes.items()},
        aliases=aliases,
        structure=structure,
    )
    spec.validate(state_dict)
    return spec


def _check_coverage(st: Structure, shapes: Mapping[str, tuple[int, ...]]) -> None:
    named = {s.key for s in st.slices()} | set(st.frozen) | set(st.aliases) | set(st.aliases.values())
    unknown = [k for k in shapes if k not in named]
    if unknown:
        raise SpecError(
            f"the {st.family} adapter does not know the tensors {unknown} of {st.model_class} "
            f"(supported model classes: {', '.join(_supported_classes(st.family))}); "
            "write a spec by hand (SymmetrySpec.from_axes) or extend the adapter"
        )
    stale = sorted({s.key for s in st.slices()} - set(shapes))
    if stale:
        raise StateDictMismatchError(f"the {st.family} adapter names tensors missing from the state dict: {stale}")


def _supported_classes(family: str) -> tuple[str, ...]:
    from .registry import ADAPTERS

    return ADAPTERS.get(family).classes if family in ADAPTERS else ()


def _resolve_aliases(
    st: Structure, tensors: dict[str, tuple[AxisBinding, ...]], spaces: Mapping[str, Space]
) -> dict[str, str]:
    """Move the bindings of tied tensors onto one primary key (see the module docstring)."""
    aliases: dict[str, str] = {}
    for a, p in st.aliases.items():
        if a not in tensors or p not in tensors:
            continue
        ba, bp = tensors[a], tensors[p]
        if not any(b.side == "out" for b in bp) and any(b.side == "out" for b in ba):
            a, p, ba, bp = p, a, bp, ba  # the writer carries the bindings (validate wants a writer per space)

        def norm(bs: tuple[AxisBinding, ...]) -> set[tuple]:
            return {(b.axis, b.space, b.block, b.offset, b.side if spaces[b.space].group not in _SELF_DUAL else "")
                    for b in bs}

        if norm(ba) != norm(bp):
            raise SpecError(
                f"tied tensors {p!r} and {a!r} are bound differently ({list(bp)} vs {list(ba)}); "
                "one transform cannot act on both"
            )
        tensors[a] = ()
        aliases[a] = p
    return aliases
