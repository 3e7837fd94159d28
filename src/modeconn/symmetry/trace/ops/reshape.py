"""Reshapes and axis moves: flatten / view / reshape / unflatten / (un)squeeze that merge adjacent dims or split
one (splitting the permuted dim into (heads, head_dim) splits its spaces into per-head children, see
:mod:`modeconn.symmetry.trace`), permute / transpose, expand, and views of parameters."""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch import nn

from ..registry import module_op, node_op
from ..values import Attr, Parts, Seg, Val, offsets, shape_of
from .elementwise import other_dims

if TYPE_CHECKING:
    from ..tracer import Tracer


@module_op(nn.Flatten, per_head=True)
def flatten_module(tr: Tracer, node: torch.fx.Node, name: str, mod: nn.Module, x: Val) -> Val | None:
    return reshape(tr, node, x)


@node_op(torch.flatten, torch.reshape, torch.unflatten, torch.unsqueeze, torch.squeeze,
         methods=("flatten", "view", "reshape", "unflatten", "unsqueeze", "squeeze"), first=True)
def reshape(tr: Tracer, node: torch.fx.Node, x: Val | None) -> Val | None:
    """flatten / view / reshape / unflatten that merges adjacent dims or splits one dim."""
    if x is None:
        return tr.frozen_val(node)
    in_shape, out_shape = shape_of(node.args[0]), shape_of(node)
    if in_shape is None or out_shape is None:
        return tr.unsupported(node, "shape unknown")
    new = reshaped(tr, x, in_shape, out_shape)
    if isinstance(new, (Val, Parts)):
        return new
    if tr.all_frozen(x):
        return tr.frozen_val(node)
    return tr.unsupported(node, new)


def reshaped(tr: Tracer, x: Val, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> Val | Parts | str:
    """``x`` after a reshape from ``in_shape`` to ``out_shape``; a string says why the symmetry cannot follow."""
    if in_shape == out_shape:
        return x
    new = merge_or_split(tr, x, in_shape, out_shape)
    if isinstance(new, str) and x.dim is not None and 1 not in (in_shape[x.dim], *(in_shape[d] for d in (x.outer,) if d is not None)):
        new = compact_reshape(tr, x, in_shape, out_shape) or kept_dim(x, in_shape, out_shape) or new
    return new


def merge_or_split(tr: Tracer, x: Val, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> Val | Parts | str:
    merged, split = merged_range(in_shape, out_shape), merged_range(out_shape, in_shape)
    if merged is not None:
        return merge_dims(tr, x, in_shape, *merged)
    if split is not None:
        return split_dim(tr, x, out_shape, *split)
    return grouped_reshape(tr, x, in_shape, out_shape)


def grouped_reshape(tr: Tracer, x: Val, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> Val | Parts | str:
    """A reshape that regroups several independent runs of dims at once (CoAtNet's and MobileNetV4's
    ``(B, C, H, W) → (B, heads, C / heads, H·W)``; Twins' and Hiera's windows ``(B, nH, nW, h, w, C) → (B, nH·nW, h·w,
    3, heads, head_dim)``; HaloNet's blocks): applied run by run, each a merge or a split of the dims it covers; a run
    touching the permuted dim or the per-head axis keeps, merges or splits it, or regroups it through the common
    refinement of its dims (:func:`through_atoms`); any other run may regroup its dims freely (they carry no
    symmetry)."""
    runs = dim_runs(in_shape, out_shape)
    why = f"reshape {in_shape} → {out_shape} neither merges adjacent dims nor splits one"
    if runs is None:
        return why
    cur: Val | Parts = x
    shape, pos = list(in_shape), 0
    for (i0, i1), (o0, o1) in runs:
        ni, no = i1 - i0, o1 - o0
        new = shape[:pos] + list(out_shape[o0:o1]) + shape[pos + ni :]
        if ni > 1 and no == 1 and isinstance(cur, Val):
            step: Val | Parts | str = merge_dims(tr, cur, tuple(shape), pos, pos + ni - 1)
        elif ni == 1 and no > 1 and isinstance(cur, Val):
            step = split_dim(tr, cur, tuple(new), pos, pos + no - 1)
        elif ni == no == 1 or not touched_axes(cur) & set(range(pos, pos + ni)):  # a dim kept, or dims without symmetry
            step = cur.remap(lambda d, pos=pos, ni=ni, no=no: d if d < pos else d + no - ni, len(new))
        elif isinstance(cur, Val):
            step = through_atoms(tr, cur, tuple(shape), pos, in_shape[i0:i1], out_shape[o0:o1])
        else:
            return why
        if isinstance(step, str):
            return step
        cur, shape, pos = step, new, pos + no
    return cur


def through_atoms(tr: Tracer, x: Val, shape: tuple[int, ...], pos: int, ins: tuple[int, ...],
                  outs: tuple[int, ...]) -> Val | str:
    """The run of dims ``ins`` at ``pos`` regrouped into ``outs`` as splits into their common refinement (the atoms)
    and merges of the atoms: BoTNet's ``(B, heads · d) → (B · heads, d)`` splits the channels into (heads, d), then
    merges the samples with the heads (and back); MobileViT's ``(B · C · nh, nw) → (B, C, nh · nw)`` takes the
    channels out of the batch axis and merges the patch rows with the columns."""
    why = f"reshape {ins} → {outs} regroups dims other than through a common refinement of both shapes"
    cuts_in, cuts_out = list(itertools.accumulate(ins, operator.mul)), list(itertools.accumulate(outs, operator.mul))
    cuts = sorted({*cuts_in, *cuts_out})
    if 1 in ins or 1 in outs or any(b % a for a, b in zip([1, *cuts], cuts, strict=False)):
        return why
    atoms = [b // a for a, b in zip([1, *cuts], cuts, strict=False)]
    cur: Val | Parts | str = x
    for k in reversed(range(len(ins))):  # split every input dim into its atoms, the last first: positions stay valid
        lo, hi = cuts.index(cuts_in[k - 1]) + 1 if k else 0, cuts.index(cuts_in[k]) + 1
        new = (*shape[: pos + k], *atoms[lo:hi], *shape[pos + k + 1 :])
        if hi - lo > 1:
            cur = split_dim(tr, cur, new, pos + k, pos + k + hi - lo - 1) if isinstance(cur, Val) else why
        shape = new
    for k in range(len(outs)):  # merge the atoms of every output dim
        lo, hi = cuts.index(cuts_out[k - 1]) + 1 if k else 0, cuts.index(cuts_out[k]) + 1
        if hi - lo > 1:
            cur = merge_dims(tr, cur, shape, pos + k, pos + k + hi - lo - 1) if isinstance(cur, Val) else why
            shape = (*shape[: pos + k], outs[k], *shape[pos + k + hi - lo :])
    return cur if isinstance(cur, (Val, str)) else why


def touched_axes(v: Val | Parts) -> set[int]:
    """The axes of a value that carry symmetry: its permuted dim and per-head axis (those of every part)."""
    if isinstance(v, Parts):
        return {v.axis}.union(*(touched_axes(p) for p in v.vals))
    return {d for d in (v.dim, v.outer) if d is not None}


def dim_runs(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[tuple[tuple[int, int], tuple[int, int]]] | None:
    """The shortest consecutive runs ``((i0, i1), (o0, o1))`` of input and output dims with equal products that
    tile both shapes; None if the sizes do not line up."""
    runs, i, o = [], 0, 0
    while i < len(in_shape) or o < len(out_shape):
        i0, o0, pi, po = i, o, 1, 1
        if i < len(in_shape):
            pi, i = in_shape[i], i + 1
        if o < len(out_shape):
            po, o = out_shape[o], o + 1
        while pi != po:
            if pi < po and i < len(in_shape):
                pi, i = pi * in_shape[i], i + 1
            elif po < pi and o < len(out_shape):
                po, o = po * out_shape[o], o + 1
            else:
                return None
        runs.append(((i0, i), (o0, o)))
    return runs


def compact_reshape(tr: Tracer, x: Val, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> Val | Parts | None:
    """A reshape that also adds or drops size-1 dims (ResNeSt's ``(B, C, 1, 1) → (B, 1, radix, C / radix)``):
    the merge or split of the dims of size > 1, placed back among the size-1 dims; None if it is neither."""
    keep_in = [i for i, n in enumerate(in_shape) if n != 1]
    keep_out = [i for i, n in enumerate(out_shape) if n != 1]
    compact_in, compact_out = tuple(in_shape[i] for i in keep_in), tuple(out_shape[i] for i in keep_out)
    if compact_in == compact_out:
        new: Any = x.remap(lambda d: keep_in.index(d), len(keep_in))
    else:
        new = merge_or_split(tr, x.remap(lambda d: keep_in.index(d), len(keep_in)), compact_in, compact_out)
    if isinstance(new, str):
        return None
    return new.remap(lambda d: keep_out[d], len(out_shape))


def merge_dims(tr: Tracer, x: Val, in_shape: tuple[int, ...], s: int, e: int) -> Val | str:
    """Dims ``s..e`` of ``in_shape`` merged into one; a string says why the symmetry cannot follow."""
    nd = len(in_shape) - (e - s)

    def inside(d: int | None) -> bool:
        return d is not None and s <= d <= e

    if not inside(x.dim):
        if inside(x.outer):
            # (B, heads, …) → (B · heads, …) (BoTNet's heads in the batch axis): the heads' layouts repeat per sample;
            # (B · heads, blocks, …) → (B · heads · blocks, …) (HaloNet): each head's layout repeats per block
            before, inner = math.prod(in_shape[s : x.outer]), math.prod(in_shape[x.outer + 1 : e + 1])
            return Val(x.dim if x.dim < s else x.dim - (e - s), nd, tuple(g for g in x.segs for _ in range(inner)) * before, s)
        return x.remap(lambda d: d if d < s else d - (e - s), nd)
    if x.outer is not None:  # merging heads back: (…, heads, head_dim) → (…, heads·head_dim)
        if (x.outer, x.dim) == (s, e) and e == s + 1 and all(g.n * g.block == in_shape[e] for g in x.segs):
            return Val(s, nd, x.segs)
        return "flatten merges per-head spaces in an order other than (head, feature)"
    # earlier dims merged in repeat the layout (timm's patch merging: (…, 2, 2, C) → 4C, every copy moves alike)
    before, inner = math.prod(in_shape[s : x.dim]), math.prod(in_shape[x.dim + 1 : e + 1])
    return Val(s, nd, tuple(Seg(g.space, g.n, g.block * inner) for g in x.segs) * before)


def split_dim(tr: Tracer, x: Val, out_shape: tuple[int, ...], s: int, e: int) -> Val | str:
    """Dim ``s`` split into dims ``s..e`` of ``out_shape``; splitting the permuted dim into (groups, width)
    splits its spaces into per-group children (see the module docstring)."""
    nd = len(out_shape)
    moved = x.remap(lambda d: d if d <= s else d + (e - s), nd)
    if x.outer == s:
        return split_heads_axis(x, out_shape, s, e)
    if x.dim != s:
        return moved
    big = [s + i for i, n in enumerate(out_shape[s : e + 1]) if n != 1]
    if len(big) <= 1:  # only singleton dims appear around the permuted one
        return replace(moved, dim=big[0] if big else s)
    units = unit_part(x, out_shape[s : e + 1]) if x.outer is None else None
    if units is not None:
        return Val(s + units[0], nd, units[1])
    if len(big) == 3 and x.outer is None:
        return split_parts(tr, x, out_shape, big)
    if len(big) > 2 or x.outer is not None:
        return "reshape splits the permuted dim into more than (parts, groups, width)"
    outer, dim = big
    width = out_shape[dim]
    heads: list[Seg] = []
    for g, off in offsets(x):
        if g.block != 1 or off % width or g.n % width:
            return f"splitting the permuted dim into groups of {width} cuts through a space"
        parts = tr.split(g.space, g.n // width)
        if parts is None:
            return "the permuted dim is already split into groups of another width"
        heads.extend(Seg(c, width) for c in parts)
    return Val(dim, nd, tuple(heads), outer)


def unit_part(x: Val, sizes: tuple[int, ...]) -> tuple[int, tuple[Seg, ...]] | None:
    """The part ``j`` of a split of ``x``'s permuted dim into ``sizes`` that carries its units, and their layout
    along it: the parts before ``j`` repeat the layout (the inverse of merging earlier dims in, :func:`merge_dims`),
    the parts after it fall within every unit's block (a flattened unit taken apart). None if no part does so
    (a split into heads, :func:`split_dim`, then applies)."""
    for j, n in enumerate(sizes):
        before, inner = math.prod(sizes[:j]), math.prod(sizes[j + 1 :])
        k, total = 0, 0
        while k < len(x.segs) and total < n * inner:
            total, k = total + x.segs[k].n * x.segs[k].block, k + 1
        period = x.segs[:k]
        if n > 1 and total == n * inner and x.segs == period * before and all(g.block % inner == 0 for g in period):
            return j, tuple(Seg(g.space, g.n, g.block // inner) for g in period)
    return None


def split_heads_axis(x: Val, out_shape: tuple[int, ...], s: int, e: int) -> Val | str:
    """The per-head axis (B · heads) split back into (B, heads): the heads' layouts must repeat for every sample."""
    heads = out_shape[e]
    if any(n != 1 for n in out_shape[s + 1 : e]) or len(x.segs) % heads or any(
            x.segs[i] != x.segs[i % heads] for i in range(len(x.segs))):
        return "reshape splits the axis indexing per-head spaces other than into (samples, heads)"
    return Val(x.dim + (e - s), len(out_shape), x.segs[:heads], e)


def split_parts(tr: Tracer, x: Val, out_shape: tuple[int, ...], big: list[int]) -> Parts | str:
    """The permuted dim split into (parts, heads, head_dim): a fused q/k/v projection (timm's ViT
    ``qkv(x).reshape(B, N, 3, heads, head_dim)``). Its space is split into the parts (q, k, v: never exchanged),
    each part into per-head children; q's and k's heads are joined later where ``q kᵀ`` contracts them."""
    axis, outer, dim = big
    if len(x.segs) != 1 or x.segs[0].block != 1:
        return "a fused q/k/v split of a concatenated or flattened value"
    parts = tr.split(x.segs[0].space, out_shape[axis])
    if parts is None:
        return "the permuted dim is already split differently"
    vals = []
    for p in parts:
        heads = tr.split(p, out_shape[outer])
        if heads is None:
            return "a part of the fused projection is already split differently"
        vals.append(Val(dim, len(out_shape), tuple(Seg(h, out_shape[dim]) for h in heads), outer))
    return Parts(axis, tuple(vals))


@node_op(torch.permute, torch.transpose, methods=("permute", "transpose"), first=True)
def permute(tr: Tracer, node: torch.fx.Node, x: Val | None) -> Val | None:
    if x is None:
        return tr.frozen_val(node)
    if node.target in ("transpose", torch.transpose):
        a, b = (d % x.ndim for d in node.args[1:3])
        return x.remap(lambda d: b if d == a else a if d == b else d, x.ndim)
    order = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (tuple, list)) else node.args[1:]
    order = [d % x.ndim for d in order]
    return x.remap(order.index, x.ndim)


@node_op(methods=("expand", "expand_as"), first=True)
def expand(tr: Tracer, node: torch.fx.Node, x: Val | None) -> Val | None:
    """``x.expand(…)``: broadcasting size-1 dims; the permuted dim (and a per-head axis) must keep its size."""
    in_shape, out_shape = shape_of(node.args[0]), shape_of(node)
    if in_shape is None or out_shape is None or len(in_shape) != len(out_shape):
        return tr.unsupported(node, "expand that adds dims") if x is not None and not tr.all_frozen(x) else (
            tr.frozen_val(node))
    return other_dims(tr, node, x, {d for d, (a, b) in enumerate(zip(in_shape, out_shape, strict=True)) if a != b},
                           "broadcasts")


def parameter_view(tr: Tracer, node: torch.fx.Node, a: Attr) -> Attr | Val | None:
    """A parameter reshaped by adding or removing size-1 dims (timm's layer scale ``gamma.reshape(1, -1, 1, 1)``):
    still that parameter, its axes mapped to the stored ones; any other reshape freezes it."""
    shape = shape_of(node)
    if shape is None or a.key is None or [d for d in shape if d != 1] != [d for d in a.shape if d != 1]:
        return tr.value(node.args[0])
    return Attr(a.key, tuple(shape), a.stored or a.shape)


def merged_range(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> tuple[int, int] | None:
    """(s, e) such that out_shape is in_shape with dims s..e multiplied into one, else None."""
    if len(out_shape) >= len(in_shape):
        return None
    k = len(in_shape) - len(out_shape)
    for s in range(len(out_shape)):
        e = s + k
        if in_shape[:s] == out_shape[:s] and in_shape[e + 1 :] == out_shape[s + 1 :] and math.prod(
            in_shape[s : e + 1]
        ) == out_shape[s]:
            return s, e
    return None


def kept_dim(x: Val, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> Val | None:
    """A reshape that only regroups the dims before and after the permuted one, which survives whole (Swin's and MaxViT's
    window partitions ``(B, H, W, C) → (B, H/7, 7, W/7, 7, C)``): x at its new position; None otherwise."""
    if x.outer is not None:
        return None
    before = math.prod(in_shape[: x.dim])
    for k, n in enumerate(out_shape):
        if n == in_shape[x.dim] and math.prod(out_shape[:k]) == before:
            return Val(k, len(out_shape), x.segs)
    return None
