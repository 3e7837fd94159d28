"""Binary elementwise ops (add, mul, …, broadcasting) and ``addcmul``: two activations join their spaces; a
parameter combined with activations (a positional embedding, a per-feature scale) is bound to their spaces
output side, like a bias."""

from __future__ import annotations

import operator
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
import torch.fx

from ..registry import node_op
from ..values import Attr, Val, constant_along, offsets, same_layout, shape_of

if TYPE_CHECKING:
    from ..tracer import Tracer


@node_op(operator.add, operator.sub, operator.mul, operator.truediv, operator.iadd, operator.imul,
         torch.add, torch.sub, torch.mul, torch.div, torch.maximum, torch.minimum,
         methods=("add", "add_", "sub", "mul", "mul_", "div", "maximum", "minimum"))
def binary(tr: Tracer, node: torch.fx.Node) -> Val | None:
    """``a ∘ b`` elementwise (add, mul, …, broadcasting): a parameter operand is bound like a bias
    (:func:`parameter_operand`); two activations with the same layout union their spaces."""
    operands = [a for a in node.args[:2] if isinstance(a, torch.fx.Node)]
    raw = [tr.vals.get(a) for a in operands]
    if len(raw) == 2 and sum(isinstance(v, Attr) for v in raw) == 1 and sum(isinstance(v, Val) for v in raw) == 1:
        (x_node, x), (p_node, p) = sorted(zip(operands, raw, strict=False), key=lambda av: isinstance(av[1], Attr))
        return parameter_operand(tr, node, x_node, x, p_node, p)
    pairs = [(a, v) for a, v in ((a, tr.value(a)) for a in operands) if v is not None]
    if not pairs:
        return tr.frozen_val(node)
    if len(pairs) == 1:
        a_node, v = pairs[0]
        if shape_of(node) != shape_of(a_node):
            return tr.unsupported(node, "broadcasting against a non-tensor changes the shape")
        return v
    return binary_values(tr, node, *pairs)


def binary_values(tr: Tracer, node: torch.fx.Node, first: tuple, second: tuple) -> Val | None:
    """:func:`binary` of two traced activations ``(node, value)``."""
    (_, a), (_, b) = first, second
    if tr.all_frozen(a) and tr.all_frozen(b):
        return tr.frozen_val(node)
    passed = broadcast_constant(tr, node, first, second)
    if passed is not None:
        return passed
    if not same_layout(a, b) and a.width == b.width and (a.ndim, a.dim, a.outer) == (b.ndim, b.dim, b.outer) and (
            a.outer is None):  # different cuts of one axis (GhostNet: [primary, cheap] + shortcut): refine both
        cuts = {off for v in (a, b) for _, off in offsets(v)} | {a.width}
        a, b = tr.refine(a, cuts) or a, tr.refine(b, cuts) or b
    if not same_layout(a, b):
        return tr.unsupported(node, "operands carry symmetry layouts that do not refine to one")
    tr.union_segs(a, b, node)
    return a


def broadcast_constant(tr: Tracer, node: torch.fx.Node, first: tuple, second: tuple) -> Val | None:
    """The permuted operand when the other one is unpermuted (its spaces frozen or of one unit: MobileViT-v2's single
    query channel) and constant along its permuted dim (a scalar, a per-token mask: it broadcasts), else None."""
    for (x_node, x), (c_node, c) in ((first, second), (second, first)):
        if tr.inactive(c) and not tr.all_frozen(x) and shape_of(x_node) == shape_of(node) and constant_along(
            shape_of(node), shape_of(c_node), x.dim
        ):
            return x
    return None


def parameter_operand(tr: Tracer, node: torch.fx.Node, x_node, x: Val, p_node, p: Attr) -> Val | None:
    """``x ∘ p`` for activations ``x`` and a parameter/buffer ``p`` (a positional embedding added to tokens,
    a per-feature scale): ``p``'s axis that broadcasts against ``x.dim`` is bound to x's spaces on the
    output side, like a bias; a ``p`` constant along that axis needs no binding."""
    out_shape = shape_of(node)
    if p.key is None and tr.all_frozen(x):  # constants only (DINOv3's rotary coordinates): nothing moves
        return tr.frozen_val(node)
    if out_shape is None or shape_of(x_node) != out_shape:
        return tr.unsupported(node, f"{p_node.name} broadcasts the activations to a larger shape")
    if constant_along(out_shape, p.shape, x.dim):
        return x
    axis = p.stored_axis(x.dim - (len(out_shape) - len(p.shape)))
    if p.key is None:  # a tensor outside the state dict cannot move with x
        tr.freeze(x)
        return x
    if x.outer is not None:
        if not tr.all_frozen(x):
            return tr.unsupported(node, f"parameter {p.key!r} would need a different permutation per index of axis {x.outer}")
        tr.freeze(p)
        return x
    prev = tr.attr_bound.get(p.key)
    if prev is None:
        tr.attr_bound[p.key] = (axis, x)
        tr.bind(p.key, axis, x, "out")
    elif prev[0] != axis or not same_layout(prev[1], replace(x, ndim=prev[1].ndim, dim=prev[1].dim)):
        return tr.unsupported(node, f"parameter {p.key!r} is combined with activations of different layouts")
    else:
        tr.union_segs(prev[1], x, node)
    return x


@node_op(torch.addcmul, methods=("addcmul",))
def addcmul(tr: Tracer, node: torch.fx.Node) -> Val | None:
    """``torch.addcmul(beta, alpha, x)`` = ``beta + alpha·x`` with per-feature parameters (ResMLP's ``Affine``):
    both bound to x's spaces like biases (:func:`parameter_operand`)."""
    operands = [a for a in node.args[:3] if isinstance(a, torch.fx.Node)]
    raw = [tr.vals.get(a) for a in operands]
    acts = [(a, v) for a, v in zip(operands, raw, strict=True) if isinstance(v, Val)]
    params = [(a, v) for a, v in zip(operands, raw, strict=True) if isinstance(v, Attr)]
    if len(operands) != 3 or node.kwargs.get("value", 1) != 1 or len(acts) != 1 or len(params) != 2:
        return tr.unsupported(node, "addcmul other than parameter + parameter · activations")
    (x_node, x), out = acts[0], acts[0][1]
    for p_node, p in params:
        out = parameter_operand(tr, node, x_node, x, p_node, p)
    return out
