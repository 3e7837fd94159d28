"""Attention and products: ``nn.MultiheadAttention`` and fused self-attention, ``matmul`` / ``bmm`` / ``@``,
``F.scaled_dot_product_attention``, and what keeps a fused q/k/v value (:class:`~..values.Parts`) together."""

from __future__ import annotations

import operator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from ...spec import AxisBinding
from ..registry import module_op, node_op
from ..values import Attr, Pair, Parts, Seg, Val, matches, same_layout, shape_len, shape_of
from .elementwise import ELEMENTWISE_METHODS
from .reshape import permute

if TYPE_CHECKING:
    from ..tracer import Tracer


@module_op(nn.MultiheadAttention, per_head=True)
def multihead_attention(tr: Tracer, node: torch.fx.Node, name: str, mod: nn.MultiheadAttention, x: Val) -> tuple | None:
    """``nn.MultiheadAttention`` used for self-attention (query, key and value one tensor): the input's spaces
    on ``in_proj_weight``'s columns; per head, one space for the query/key dims (Q and K rows of the head, so
    ``q·k`` is invariant) and one for the value dims (V rows, ``out_proj`` columns); ``out_proj`` writes a new
    space. Returns ``(output, attention weights: no symmetry)`` like the module."""
    args = list(node.args) + [node.kwargs.get(k) for k in ("query", "key", "value") if k in node.kwargs]
    if len(args) < 3 or not (args[0] is args[1] is args[2]):
        return tr.unsupported(node, "MultiheadAttention with different query, key and value (cross-attention)")
    if not mod._qkv_same_embed_dim or mod.bias_k is not None or mod.add_zero_attn:
        return tr.unsupported(node, "MultiheadAttention with kdim/vdim, bias_k/bias_v or add_zero_attn")
    bias = mod.in_proj_bias is not None
    out = tr.fused_self_attention(node, name, x, mod.num_heads, (f"{name}.in_proj_weight", f"{name}.in_proj_bias" if bias else None),
                                    (f"{name}.out_proj.weight", f"{name}.out_proj.bias" if mod.out_proj.bias is not None else None))
    return out if out is None else (out, None)


def fused_self_attention(tr: Tracer, node: torch.fx.Node, name: str, x: Val, h: int, qkv: tuple[str, str | None],
                         proj: tuple[str, str | None]) -> Val | None:
    """Self-attention with a fused input projection ``qkv`` = (weight (3e, e), bias (3e,) or None) and an output
    projection ``proj`` (weight (e, e), bias): x's spaces on qkv's columns; per head, one space for the query/key
    rows (so ``q·k`` is invariant) and one for the value rows and proj's columns; proj writes a new space."""
    x = tr.require_dim(node, x, x.ndim - 1)
    if x.outer is not None:
        return tr.unsupported(node, "self-attention on a value with per-head spaces")
    e = x.width
    tr.bind(qkv[0], 1, x, "in")
    qk, vo = tr.new_space(e, f"{name}.qk"), tr.new_space(e, f"{name}.vo")
    tr.split(qk, h)
    tr.split(vo, h)
    for key in filter(None, qkv):
        for offset, space in ((0, qk), (e, qk), (2 * e, vo)):
            tr.bindings.append((key, AxisBinding(0, "", "out", 1, offset, True), space))
    tr.bindings.append((proj[0], AxisBinding(1, "", "in", 1, 0, False), vo))
    out = Val(x.dim, x.ndim, (Seg(tr.module_out_space(name, e), e),))
    for key in filter(None, proj):
        tr.bind(key, 0, out, "out")
    return out


@node_op(operator.matmul, torch.matmul, torch.bmm, methods=("matmul", "bmm"))
def matmul(tr: Tracer, node: torch.fx.Node) -> Val | None:
    """``a @ b`` (matmul / bmm; batch dims broadcast). A permuted dim contracted on both sides with the same
    spaces (``q @ kᵀ`` per head) unions them and leaves an invariant result; a permuted dim of one operand
    that is not contracted (rows of a, columns of b, per-head spaces on a batch axis) carries over when the
    other operand is not permuted (``attn @ v``), and so does a batch axis both permute with the same spaces.
    Everything else mixes along a permuted dim: unsupported."""
    operands = list(node.args[:2])
    raw = [tr.vals.get(o) if isinstance(o, torch.fx.Node) else None for o in operands]
    if isinstance(raw[0], Val) and isinstance(raw[1], Attr) and raw[1].key is not None and len(raw[1].shape) == 2 and (
            raw[0].dim == raw[0].ndim - 1 and not tr.inactive(raw[0])):
        return matmul_parameter(tr, node, raw[0], raw[1])
    a, b = (tr.value(o) for o in operands)
    out_shape = shape_of(node)
    if a is None or b is None or out_shape is None:
        return tr.unsupported(node, "matmul of non-tensor operands")
    nd = len(out_shape)
    if isinstance(a, Pair) or isinstance(b, Pair) or carries_two(tr, a, b):
        return matmul_pairs(tr, node, a, b, operands, nd)
    for x, h in ((a, b), (b, a)):
        fix_whole_heads(tr, x, h, nd)
    # frozen or size-1 spaces (e.g. a Linear(D, 1) attention-pooling score): only the identity acts on them
    live_a, live_b = not tr.inactive(a), not tr.inactive(b)
    if not (live_a or live_b):
        return tr.frozen_val(node)
    if a.ndim < 2 or b.ndim < 2:
        return tr.unsupported(node, "matrix-vector product with a permuted operand")
    con_a, con_b = live_a and a.dim == a.ndim - 1, live_b and b.dim == b.ndim - 2
    if con_a or con_b:
        if not (con_a and con_b and contract(tr, node, a, b, operands, nd)):
            return tr.unsupported(node, "contracts a permuted dim with one that does not carry the same spaces")
        return tr.frozen_val(node)  # (a P)(Pᵀ b) = a b
    if live_a and live_b:
        return matmul_joint_batch(tr, node, a, b, nd)
    if live_a:
        return matmul_one_sided(tr, node, a, operands[1], a.ndim - 1, nd)
    return matmul_one_sided(tr, node, b, operands[0], b.ndim - 2, nd)


def carries_two(tr: Tracer, a: Val, b: Val) -> bool:
    """Whether ``a @ b`` carries a permuted dim from each side: a's rows and b's columns (``kᵀ v``)."""
    return not (tr.inactive(a) or tr.inactive(b)) and a.dim == a.ndim - 2 and b.dim == b.ndim - 1


def live_components(tr: Tracer, x: Val | Pair) -> list[Val]:
    return [v for v in (x.vals if isinstance(x, Pair) else (x,)) if not tr.inactive(v)]


def matmul_pairs(tr: Tracer, node: torch.fx.Node, a: Val | Pair, b: Val | Pair, operands: list, nd: int) -> Any:
    """``a @ b`` where the product carries a permuted dim from each side (``kᵀ v``: a :class:`Pair`), or where an
    operand is such a pair (``q (kᵀ v)``, ``(kᵀ v) qᵀ``): the contracted dims' spaces joined as for ``q kᵀ``, a's
    permuted rows and b's permuted columns carried to the product. Permuted batch axes are unsupported here."""
    ca, cb = live_components(tr, a), live_components(tr, b)
    na, nb = ca[0].ndim if ca else nd, cb[0].ndim if cb else nd
    ka, rows = [c for c in ca if c.dim == na - 1], [c for c in ca if c.dim == na - 2]
    kb, cols = [c for c in cb if c.dim == nb - 2], [c for c in cb if c.dim == nb - 1]
    carried = [c.remap(lambda d, s=nd - na: d + s, nd) for c in rows] + [c.remap(lambda d, s=nd - nb: d + s, nd) for c in cols]
    if len(ka) + len(rows) != len(ca) or len(kb) + len(cols) != len(cb) or any(
            c.outer is not None and c.outer >= nd - 2 for c in carried):
        return tr.unsupported(node, "a product of values permuted along two dims with a permuted batch or head axis")
    if (ka or kb) and not (ka and kb and contract(tr, node, ka[0], kb[0], operands, nd)):
        return tr.unsupported(node, "contracts a permuted dim with one that does not carry the same spaces")
    if not carried:
        return tr.frozen_val(node)
    return carried[0] if len(carried) == 1 else Pair(tuple(carried))  # type: ignore[arg-type]


def contract(tr: Tracer, node: torch.fx.Node, a: Val, b: Val, operands: list, nd: int) -> bool:
    """Join the spaces of a's last dim and b's second-to-last, which ``a @ b`` contracts (per head, or every head's
    with one shared by all heads); False (nothing joined) if their layouts differ."""
    if shared_across_heads(tr, node, (a, b), operands, nd):
        return True
    if not contractible(tr, a, b, nd):
        return False
    tr.union_segs(a, b, node)
    return True


def fix_whole_heads(tr: Tracer, x: Val, heads: Val, nd: int) -> None:
    """Freeze ``x``'s spaces if it is permuted along the axis indexing ``heads``' per-head spaces (EfficientFormer-V2's
    talking-head convolution writes the attention weights head by head): exchanging whole heads is not modelled, and
    within-head permutations never move that axis."""
    if isinstance(x, Val) and isinstance(heads, Val) and heads.outer is not None and x.outer is None and (
            x.dim < x.ndim - 2 and x.dim + nd - x.ndim == heads.outer + nd - heads.ndim) and not tr.inactive(heads):
        tr.freeze(x)


def matmul_parameter(tr: Tracer, node: torch.fx.Node, x: Val, p: Attr) -> Val | None:
    """``x @ p`` for a parameter ``p`` whose rows x's permuted last dim contracts (BoTNet's relative-position logits
    ``q @ rel_kᵀ``, one table for every head): the heads' spaces joined into one (the table is shared), the table's
    axis bound to it; the result carries no symmetry."""
    if x.outer is not None and not tr.join_heads(node, x):
        return tr.unsupported(node, "a parameter contracted with heads of different layouts")
    one = Val(0, 2, x.segs[:1])
    axis = p.stored_axis(0)
    prev = tr.attr_bound.get(p.key)
    if prev is not None and (prev[0] != axis or not same_layout(prev[1], one)):
        return tr.unsupported(node, f"parameter {p.key!r} is read with different layouts")
    if prev is not None:
        tr.union_segs(prev[1], one, node)
    else:
        tr.attr_bound[p.key] = (axis, one)
        tr.bind(p.key, axis, one, "in")
    return tr.frozen_val(node)


def matmul_joint_batch(tr: Tracer, node: torch.fx.Node, a: Val, b: Val, nd: int) -> Val | None:
    """Both operands permuted on the same batch axis (heads of width 1): permuted jointly."""
    if a.dim < a.ndim - 2 and b.dim < b.ndim - 2 and a.dim + nd - a.ndim == b.dim + nd - b.ndim and same_layout(
        replace(a, ndim=nd, dim=0), replace(b, ndim=nd, dim=0)
    ):
        tr.union_segs(a, b, node)
        return a.remap(lambda d: d + nd - a.ndim, nd)
    return tr.unsupported(node, "both operands carry permuted dims: the product would carry two")


def matmul_one_sided(tr: Tracer, node: torch.fx.Node, v: Val, o_node: Any, contracted: int, nd: int) -> Val | None:
    """Only ``v`` is permuted, on a dim that is not contracted (``contracted``: its contracted axis); the other
    operand ``o_node`` is not permuted."""
    shift = nd - v.ndim
    if v.outer == contracted:
        return tr.unsupported(node, "sums over the axis indexing per-head spaces")
    if v.dim < v.ndim - 2:  # permuting a batch axis: the other operand must not vary along it
        o_shape = shape_of(o_node) or ()
        o_axis = v.dim + shift - (nd - len(o_shape))
        if 0 <= o_axis < len(o_shape) - 2 and o_shape[o_axis] != 1:
            return tr.unsupported(node, "permutes a batch axis the other operand varies along")
    return v.remap(lambda d: d + shift, nd)


def shared_across_heads(tr: Tracer, node: torch.fx.Node, vals: tuple[Val, Val], nodes: Any, nd: int | None) -> bool:
    """Multi-query attention (MobileNetV4's ``q @ kᵀ`` with q per head and one key for all heads, broadcast along the
    head axis): every head's query space joined with the single key space; False (nothing joined) if the operands
    are not one per-head value and one value of a single space, of equal widths, broadcast along the head axis."""
    heads = [i for i, v in enumerate(vals) if v.outer is not None]
    if len(heads) != 1:
        return False
    per_head, shared = vals[heads[0]], vals[1 - heads[0]]
    shape = shape_of(nodes[1 - heads[0]])
    nd = per_head.ndim if nd is None else nd
    axis = per_head.outer + nd - per_head.ndim - (nd - len(shape)) if shape is not None else -1
    if shared.outer is not None or len(shared.segs) != 1 or (0 <= axis and shape[axis] != 1):
        return False
    if any((s.n, s.block) != (shared.segs[0].n, shared.segs[0].block) for s in per_head.segs):
        return False
    for s in per_head.segs:
        tr.union(s.space, shared.segs[0].space, node)
    return True


def contractible(tr: Tracer, a: Val, b: Val, nd: int) -> bool:
    """Whether a's last dim and b's second-to-last carry the same layout (per head on one batch axis)."""
    if len(a.segs) != len(b.segs) or any((sa.n, sa.block) != (sb.n, sb.block) for sa, sb in zip(a.segs, b.segs, strict=False)):
        return False
    if a.outer is None or b.outer is None:
        return a.outer is None and b.outer is None
    return a.outer < a.ndim - 2 and b.outer < b.ndim - 2 and a.outer + nd - a.ndim == b.outer + nd - b.ndim


@node_op(F.scaled_dot_product_attention)
def attention_function(tr: Tracer, node: torch.fx.Node) -> Val | None:
    """``F.scaled_dot_product_attention(q, k, v)``: like ``softmax(q kᵀ) v`` — q's and k's spaces joined per
    head (the scores are invariant), the output carries v's."""
    q, k, v = (tr.value(a) for a in node.args[:3])
    if q is None or k is None or v is None:
        return tr.unsupported(node, "attention of non-tensor operands")
    fixed_score_terms(tr, node)
    if tr.inactive(q) and tr.inactive(k):
        return v
    if q.dim == q.ndim - 1 and k.dim == k.ndim - 1 and shared_across_heads(tr, node, (q, k), node.args[:2], None):
        return v
    if not (q.dim == q.ndim - 1 and k.dim == k.ndim - 1 and same_layout(q, k)):
        return tr.unsupported(node, "query and key carry their symmetry on different dims or layouts")
    tr.union_segs(q, k, node)
    return v


def fixed_score_terms(tr: Tracer, node: torch.fx.Node) -> None:
    """The mask or bias ``scaled_dot_product_attention`` adds to the scores (CoAtNet-RMLP's relative-position MLP,
    gathered by token pair): the scores are invariant, so it is never permuted."""
    for a in (*node.args[3:], *node.kwargs.values()):
        if isinstance(a, torch.fx.Node):
            tr.freeze(tr.value(a))


def parts_op(tr: Tracer, node: torch.fx.Node, x: Parts) -> Any:
    """What keeps a fused q/k/v value (:class:`Parts`): moving axes, ``unbind`` / ``x[i]`` on its part axis
    (the slices' values), dtype/contiguity methods."""
    t, nd = node.target, shape_len(node, x.vals[0].ndim)
    if matches(node, {"permute", "transpose"}, {torch.permute, torch.transpose}):
        probe = permute(tr, node, Val(x.axis, nd, ()))
        moved = [permute(tr, node, v) for v in x.vals]
        return Parts(probe.dim, tuple(moved))
    if matches(node, {"unbind"}, {torch.unbind}):
        dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0) % (x.vals[0].ndim)
        if dim == x.axis:
            return tuple(x.take(i) for i in range(len(x.vals)))
    if t is operator.getitem:
        idx = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
        if len(idx) > x.axis and isinstance(idx[x.axis], int) and all(i == slice(None) for i in idx[: x.axis]) and all(
            i == slice(None) for i in idx[x.axis + 1 :]
        ):
            return x.take(idx[x.axis])
    if matches(node, ELEMENTWISE_METHODS, set()):
        return x
    return tr.unsupported(node, "takes a fused q/k/v value apart other than along its part axis")
