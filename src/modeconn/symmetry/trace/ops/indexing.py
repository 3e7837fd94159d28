"""Concatenation, indexing and splitting: ``torch.cat`` (also of parameters: a class token, a concatenated
bias), ``x[idx]``, ``chunk`` and ``split``. Along the permuted dim they lay spaces side by side or split
them at the pieces' ends; along other dims every piece carries the same spaces."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from ..registry import node_op
from ..values import Attr, AttrCat, Seg, Val, same_layout, shape_len, shape_of, whole_segments

if TYPE_CHECKING:
    from ..tracer import Tracer


@node_op(torch.cat)
def cat(tr: Tracer, node: torch.fx.Node) -> Val | None:
    parts = node.args[0]
    dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0)
    attrs = [p for p in parts if isinstance(tr.vals.get(p), Attr) and tr.vals[p].key is not None]
    # a class token prepended to the patches: bound like a bias
    if attrs and any(not isinstance(tr.vals.get(p), Attr) for p in parts):
        return cat_parameters(tr, node, parts, dim)
    if all(isinstance(tr.vals.get(p), Attr) and len(tr.vals[p].shape) == 1 for p in parts):
        return AttrCat(tuple((tr.vals[p], tr.vals[p].shape[0], constant_tensor(tr, p)) for p in parts))
    vals = [tr.value(p) for p in parts]
    if any(v is None for v in vals):
        return tr.unsupported(node, "concatenation of non-tensor values")
    ndim = vals[0].ndim
    dim %= ndim
    if any(v.dim != vals[0].dim for v in vals):
        return tr.unsupported(node, "concatenated tensors carry their symmetry on different dims")
    if any(v.outer is not None and not tr.all_frozen(v) for v in vals) and (  # per head: along tokens only
            dim in (vals[0].dim, vals[0].outer) or not all(same_layout(vals[0], v) for v in vals[1:])):
        return tr.unsupported(node, "concatenation of values with per-head spaces other than along another axis")
    if dim == vals[0].dim:
        return Val(dim, ndim, tuple(s for v in vals for s in v.segs))
    for v in vals[1:]:
        tr.union_segs(vals[0], v, node)
    return vals[0]


def constant_tensor(tr: Tracer, node: torch.fx.Node) -> bool:
    """Whether the tensor a ``get_attr`` node reads has one value throughout (a zero bias buffer)."""
    t: Any = tr.gm
    for part in str(node.target).split("."):
        t = getattr(t, part, None)
    return torch.is_tensor(t) and t.numel() > 0 and bool((t == t.reshape(-1)[0]).all())


def cat_parameters(tr: Tracer, node: torch.fx.Node, parts: list, dim: int) -> Val | None:
    """``cat([token, x], dim)`` along a dim the symmetry does not act on, ``token`` a parameter (a ViT's class
    token, expanded over the batch): its axis along the permuted dim is bound to x's spaces, output side."""
    acts = [tr.value(p) for p in parts if not isinstance(tr.vals.get(p), Attr)]
    if any(v is None for v in acts):
        return tr.unsupported(node, "concatenation of non-tensor values")
    x = acts[0]
    for v in acts[1:]:
        if v.dim != x.dim:
            return tr.unsupported(node, "concatenated tensors carry their symmetry on different dims")
        tr.union_segs(x, v, node)
    if dim % x.ndim == x.dim or x.outer is not None:
        return tr.unsupported(node, "a parameter concatenated along the permuted dim (or with per-head spaces)")
    for p in parts:
        a = tr.vals.get(p)
        if isinstance(a, Attr):
            axis = x.dim - (x.ndim - len(a.shape))
            if axis < 0 or a.shape[axis] != x.width:
                return tr.unsupported(node, f"parameter {a.key!r} of shape {a.shape} does not span the permuted dim")
            prev = tr.attr_bound.get(a.key)
            if prev is None:
                tr.attr_bound[a.key] = (a.stored_axis(axis), x)
                tr.bind(a.key, a.stored_axis(axis), x, "out")
            else:
                tr.union_segs(prev[1], x, node)
    return x


def index(tr: Tracer, node: torch.fx.Node) -> Val | None:
    """``x[idx]`` with ints / full slices / ``None`` (e.g. a ViT's class token ``x[:, 0]``): allowed when the
    permuted dim is taken whole; the dims removed or inserted before it shift it."""
    x = tr.value(node.args[0])
    idx = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
    if x is None or tr.all_frozen(x):  # e.g. a relative-position bias gathered from its table
        return tr.frozen_val(node)
    if idx.count(Ellipsis) == 1:  # CrossViT's ``x[:, 0:1, ...]``: the dims it stands for, taken whole
        at = idx.index(Ellipsis)
        rest = x.ndim - sum(i is not None for i in idx if i is not Ellipsis)
        idx = idx[:at] + (slice(None),) * rest + idx[at + 1:]
    if any(i is Ellipsis or not isinstance(i, (int, slice, type(None), torch.fx.Node)) for i in idx):
        return tr.unsupported(node, "indexing with several Ellipses or lists")
    if any(isinstance(i, torch.fx.Node) for i in idx):
        return gather(tr, node, x, idx)
    out_dim, out_outer, axis, segs = x.dim, x.outer, 0, x.segs
    for i in idx:
        if i is None:
            out_dim += axis <= x.dim
            out_outer = None if out_outer is None else out_outer + (axis <= x.outer)
            continue
        whole = isinstance(i, slice) and i == slice(None)
        if axis == x.outer and not whole:
            return tr.unsupported(node, "indexing into the axis indexing per-head spaces")
        if axis == x.dim and not whole:
            segs = index_slice(tr, x, i) if isinstance(i, slice) else None
            if segs is None:
                return tr.unsupported(node, "indexing into the permuted dim other than a range of whole spaces")
        if isinstance(i, int):
            out_dim -= axis < x.dim
            out_outer = None if out_outer is None else out_outer - (axis < x.outer)
        axis += 1
    return Val(out_dim, shape_len(node, x.ndim), segs, out_outer)


def gather(tr: Tracer, node: torch.fx.Node, x: Val, idx: tuple) -> Val | None:
    """``x[:, index]`` with one index tensor on an axis before the permuted dim and full slices elsewhere (a relative-
    position bias MLP's output gathered by token pair, CoAtNet-RMLP): the indexed axis replaced by the index's dims."""
    tensors = [k for k, i in enumerate(idx) if isinstance(i, torch.fx.Node)]
    shape = shape_of(idx[tensors[0]])
    if len(tensors) != 1 or shape is None or x.outer is not None or tensors[0] >= x.dim or any(
            i != slice(None) for k, i in enumerate(idx) if k != tensors[0]):
        return tr.unsupported(node, "indexing with tensors other than one index on an axis before the permuted dim")
    tr.value(idx[tensors[0]])  # the index: read, never permuted
    return Val(x.dim - 1 + len(shape), shape_len(node, x.ndim), x.segs)


def index_slice(tr: Tracer, x: Val, i: slice) -> tuple[Seg, ...] | None:
    """The segments of a contiguous slice of the permuted dim: whole spaces, or parts of spaces split at the slice's
    ends (DPN's ``x[:, :n]`` and ``x[:, n:]`` of one convolution's output; permutations within each part); None if
    it has a step, cuts through a unit or a space is already split differently."""
    if x.outer is not None:  # per head: the same slice of every head's layout (EfficientViT drops the ones column)
        taken = [index_slice(tr, replace(x, segs=(s,), outer=None), i) for s in x.segs]
        return tuple(t[0] for t in taken) if all(t is not None and len(t) == 1 for t in taken) else None
    start, stop, step = i.indices(x.width)
    refined = tr.refine(x, {start, stop}) if step == 1 else None
    return whole_segments(refined, i) if refined is not None else None


@node_op(torch.chunk, methods=("chunk",), first=True)
def chunk(tr: Tracer, node: torch.fx.Node, x: Val | None) -> tuple | None:
    """``x.chunk(k, dim)``: along a dim the symmetry does not act on, every chunk carries x's spaces; along the
    permuted dim, x's space is split into ``k`` equal parts, one per chunk (a fused projection split into q, k,
    v; ShuffleNet's two branches)."""
    k = node.kwargs.get("chunks", node.args[1] if len(node.args) > 1 else None)
    dim = node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else 0)
    shape = shape_of(node.args[0])
    if shape is None or not isinstance(k, int):
        return tr.unsupported(node, "chunk of a value of unknown shape")
    step = -(-shape[dim] // k)
    return pieces(tr, node, x, [min(step, shape[dim] - i) for i in range(0, shape[dim], step)], dim)


@node_op(torch.split, methods=("split",), first=True)
def split_sizes(tr: Tracer, node: torch.fx.Node, x: Val | None) -> tuple | None:
    """``torch.split(x, size or sizes, dim)`` (Res2Net's scales): as :func:`chunk`."""
    size = node.kwargs.get("split_size_or_sections", node.kwargs.get("split_size", node.args[1] if len(node.args) > 1 else None))
    dim = node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else 0)
    shape = shape_of(node.args[0])
    if shape is None or not isinstance(size, (int, list, tuple)):
        return tr.unsupported(node, "split of a value of unknown shape")
    sizes = list(size) if not isinstance(size, int) else [min(size, shape[dim] - i) for i in range(0, shape[dim], size)]
    return pieces(tr, node, x, sizes, dim)


def pieces(tr: Tracer, node: torch.fx.Node, x: Val | None, sizes: list[int], dim: int) -> tuple | None:
    """Pieces of ``x`` of ``sizes`` along ``dim``; on the permuted dim its spaces are split at the pieces' ends."""
    if x is None:
        return None
    dim %= x.ndim
    if tr.all_frozen(x):
        return tuple(x if dim != x.dim else Val(dim, x.ndim, (Seg(tr.new_space(n, node.name, True), n),)) for n in sizes)
    if dim != x.dim:
        if dim == x.outer:
            return tr.unsupported(node, "splits the axis indexing per-head spaces")
        return tuple(x for _ in sizes)
    if x.outer is not None:
        return head_pieces(tr, node, x, sizes)
    found = cut(tr, x, sizes)
    if found is None:
        return tr.unsupported(node, "splits the permuted dim through a unit, or a space already split differently")
    return tuple(replace(x, segs=p) for p in found)


def head_pieces(tr: Tracer, node: torch.fx.Node, x: Val, sizes: list[int]) -> tuple | None:
    """Pieces along the per-head feature dim (EfficientFormer's q/k/v of each head; CoAtNet's and MaxViT's
    ``(B, heads, 3 · head_dim, N).chunk(3, dim=2)``): each head's layout cut alike, piece ``i`` carrying part ``i`` of
    each head."""
    heads = [cut(tr, replace(x, segs=(s,), outer=None), sizes) for s in x.segs]
    if any(h is None or any(len(p) != 1 for p in h) for h in heads):
        return tr.unsupported(node, "splits per-head values through a unit, or a space already split differently")
    return tuple(replace(x, segs=tuple(h[j][0] for h in heads)) for j in range(len(sizes)))  # type: ignore[index]


def cut(tr: Tracer, x: Val, sizes: list[int]) -> list[tuple[Seg, ...]] | None:
    """The segments of each consecutive piece of ``sizes`` of ``x``'s permuted dim (its spaces split at the pieces'
    ends); None where a piece cuts through a unit or a space is already split differently."""
    ends = [sum(sizes[: i + 1]) for i in range(len(sizes))]
    refined = tr.refine(x, {0, *ends})
    found = [whole_segments(refined, slice(a, b)) if refined else None for a, b in zip([0, *ends], ends, strict=False)]
    return None if any(p is None for p in found) else found  # type: ignore[return-value]


@node_op(torch.unbind, methods=("unbind",), first=True)
def unbind(tr: Tracer, node: torch.fx.Node, x: Val | None) -> tuple | None:
    """``x.unbind(dim)``: along the axis indexing per-head spaces, slice ``i`` carries head ``i``'s space (Twins'
    ``k, v = kv.unbind(0)`` where one head makes the key/value split (2, 1, head_dim) a per-part split); along another
    dim every slice carries x's spaces. Unbinding the permuted dim is unsupported."""
    shape = shape_of(node.args[0])
    if x is None or shape is None:
        return tr.unsupported(node, "unbind of a value of unknown shape")
    dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0) % x.ndim

    def drop(d: int) -> int:
        return d - (d > dim)

    if dim == x.dim:
        if not tr.all_frozen(x):
            return tr.unsupported(node, "unbinds the permuted dim")
        rest = [n for i, n in enumerate(shape) if i != dim] or [1]
        return tuple(Val(0, x.ndim - 1, (Seg(tr.new_space(rest[0], node.name, True), rest[0]),)) for _ in range(shape[dim]))
    if dim == x.outer:
        return tuple(Val(drop(x.dim), x.ndim - 1, (s,)) for s in x.segs)
    return tuple(x.remap(drop, x.ndim - 1) for _ in range(shape[dim]))


@node_op(torch.stack)
def stack(tr: Tracer, node: torch.fx.Node) -> Val | None:
    """``torch.stack(xs, dim)`` (CrossViT's two classifier heads stacked, then averaged): the tensors carry one
    permutation (their spaces joined, as an elementwise op's operands), along their dims moved past the new one."""
    parts = node.args[0] if node.args else node.kwargs.get("tensors", ())
    vals = [tr.value(p) for p in parts]
    if not vals or any(v is None or v.outer is not None for v in vals):
        return tr.unsupported(node, "stack of non-tensor values or of values with per-head spaces")
    x = vals[0]
    for v in vals[1:]:
        if not same_layout(v, x):
            return tr.unsupported(node, "stacked tensors carry their symmetry on different dims or layouts")
        tr.union_segs(x, v, node)
    dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0) % (x.ndim + 1)
    return x.remap(lambda d: d + (d >= dim), x.ndim + 1)
