"""Elementwise ops, activations, softmax, pooling, padding, rolls, powers and reductions: the output carries the
input's spaces (or none, after a reduction over the permuted dim)."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from ..registry import module_op, node_op
from ..values import Seg, Val, shape_len

if TYPE_CHECKING:
    from ..tracer import Tracer

ELEMENTWISE_MODULES = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.SELU, nn.CELU,
    nn.Softplus, nn.Mish, nn.Hardswish, nn.Hardtanh, nn.Hardsigmoid, nn.Identity, nn.Dropout, nn.Dropout1d,
    nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.Softsign, nn.Tanhshrink, nn.LogSigmoid,
)
POOL_MODULES = (
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d, nn.Upsample,
)
PAD_MODULES = (
    nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d, nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d,
    nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReflectionPad3d, nn.ReplicationPad1d, nn.ReplicationPad2d,
    nn.ReplicationPad3d, nn.CircularPad1d, nn.CircularPad2d, nn.CircularPad3d,
)
ELEMENTWISE_FUNCTIONS = (
    F.relu, F.relu6, F.leaky_relu, F.gelu, F.silu, F.elu, F.selu, F.celu, F.softplus, F.mish, F.hardswish,
    F.hardtanh, F.hardsigmoid, F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.logsigmoid,
    torch.relu, torch.tanh, torch.sigmoid, torch.exp, torch.abs, torch.neg, torch.square, torch.sqrt,
    operator.neg, torch.clamp, torch.clip,
)
ELEMENTWISE_METHODS = (
    "relu", "relu_", "tanh", "sigmoid", "exp", "abs", "neg", "square", "sqrt", "clamp", "clip",
    "contiguous", "clone", "detach", "float", "double", "half", "bfloat16", "to", "type_as",
)
POOL_FUNCTIONS = (
    F.max_pool1d, F.max_pool2d, F.max_pool3d, F.avg_pool1d, F.avg_pool2d, F.avg_pool3d,
    F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d,
    F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d, F.interpolate,
)


@module_op(*ELEMENTWISE_MODULES, per_head=True)
def elementwise_module(tr: Tracer, node: torch.fx.Node, name: str, mod: nn.Module, x: Val) -> Val:
    return x


# softmax / log_softmax commute with permutations of every dim, their own included (the normaliser is a
# symmetric function); an orthogonal or scaling group would need its own rule here
@module_op(nn.Softmax, nn.LogSoftmax, per_head=True)
def softmax_module(tr: Tracer, node: torch.fx.Node, name: str, mod: nn.Module, x: Val) -> Val | None:
    return softmax_over(tr, node, x, mod.dim)


@module_op(nn.PReLU)
def prelu(tr: Tracer, node: torch.fx.Node, name: str, mod: nn.Module, x: Val) -> Val:
    if mod.num_parameters > 1:
        tr.bind(f"{name}.weight", 0, tr.require_dim(node, x, 1), "out")
    return x


@module_op(*POOL_MODULES)
def pool_module(tr: Tracer, node: torch.fx.Node, name: str, mod: nn.Module, x: Val) -> Val:
    return tr.require_dim(node, x, 1)


@node_op(*ELEMENTWISE_FUNCTIONS, methods=ELEMENTWISE_METHODS, first=True)
def elementwise(tr: Tracer, node: torch.fx.Node, x: Val | None) -> Val | None:
    return x if x is not None else tr.frozen_val(node)


@node_op(F.softmax, F.log_softmax, torch.softmax, torch.log_softmax, methods=("softmax", "log_softmax"), first=True)
def softmax(tr: Tracer, node: torch.fx.Node, x: Val | None) -> Val | None:
    """softmax / log_softmax commute with permutations of every dim, their own included; over the axis indexing
    per-head spaces (ResNeSt's radix softmax) they mix the heads, which then need one permutation."""
    return softmax_over(tr, node, x, node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None))


def softmax_over(tr: Tracer, node: torch.fx.Node, x: Val | None, dim: int | None) -> Val | None:
    if x is not None and x.outer is not None and dim is not None and dim % x.ndim == x.outer and not (
            tr.join_heads(node, x)):
        return tr.unsupported(node, "softmax across per-head spaces of different layouts")
    return elementwise(tr, node, x)


@node_op(*POOL_FUNCTIONS, first=True)
def pool(tr: Tracer, node: torch.fx.Node, x: Val | None) -> Val | None:
    if x is None or tr.all_frozen(x):
        return tr.frozen_val(node)
    if x.outer is not None:
        return tr.unsupported(node, "pooling a value with per-head spaces")
    return tr.require_dim(node, x, 1)


@node_op(F.pad, first=True)
def pad(tr: Tracer, node: torch.fx.Node, x: Val | None) -> Val | None:
    """``F.pad(x, pad, …)`` of dims the symmetry does not act on (spatial padding, Swin's window padding): the padded
    entries are one constant along the permuted dim."""
    pad = node.args[1] if len(node.args) > 1 else node.kwargs.get("pad", ())
    nd = x.ndim if x is not None else 0
    touched = {nd - 1 - i: (pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2) if pad[2 * i] or pad[2 * i + 1]}
    mode = node.kwargs.get("mode", node.args[2] if len(node.args) > 2 else "constant")
    if x is not None and x.dim in touched and mode == "constant" and x.dim != x.outer and not tr.all_frozen(x):
        return padded_units(tr, node, x, *touched.pop(x.dim)) if not set(touched) & {x.outer} else (
            tr.unsupported(node, "pads the axis indexing per-head spaces"))
    return other_dims(tr, node, x, set(touched), "pads")


def padded_units(tr: Tracer, node: torch.fx.Node, x: Val, before: int, after: int) -> Val | None:
    """The permuted dim padded with a constant (EfficientViT's ``F.pad(v, (0, 1), value=1)``: a column of ones
    appended to the values): the padded entries are fixed units beside x's. Per head, each head's layout becomes a
    new space split into (fixed, x's, fixed) parts."""
    if x.outer is None:
        fixed = [Seg(tr.new_space(n, node.name, frozen=True), n) for n in (before, after)]
        return Val(x.dim, x.ndim, (*fixed[:1] * bool(before), *x.segs, *fixed[1:] * bool(after)))
    heads = []
    for s in x.segs:
        if s.block != 1:
            return tr.unsupported(node, "pads flattened per-head values")
        space = tr.new_space(before + s.n + after, node.name)
        sizes = [n for n in (before, s.n, after) if n]
        parts = list(tr.split_at(space, sizes) or ())
        mid = parts.pop(1 if before else 0)
        tr.union(mid, s.space, node)
        for p in parts:
            tr.set_frozen(p)
        heads.append(Seg(space, before + s.n + after))
    return Val(x.dim, x.ndim, tuple(heads), x.outer)


@module_op(*PAD_MODULES)
def pad_module(tr: Tracer, node: torch.fx.Node, name: str, mod: nn.Module, x: Val) -> Val | None:
    """A padding layer (BiT's stem ``ConstantPad2d``): pads its last ``len(padding) / 2`` dims, each padded entry a
    constant or a copy of an entry of the same channel."""
    n = len(mod.padding) // 2
    return other_dims(tr, node, x, set(range(x.ndim - n, x.ndim)), "pads")


@node_op(torch.roll, methods=("roll",), first=True)
def roll(tr: Tracer, node: torch.fx.Node, x: Val | None) -> Val | None:
    """``torch.roll(x, shifts, dims)`` along dims the symmetry does not act on (Swin's cyclic window shift); a roll of
    the flattened tensor (no ``dims``) moves every dim."""
    dims = node.kwargs.get("dims", node.args[2] if len(node.args) > 2 else None)
    dims = (dims,) if isinstance(dims, int) else dims or ()
    nd = x.ndim if x is not None else 0
    return other_dims(tr, node, x, {d % nd for d in dims} if dims else set(range(nd)), "rolls")


@node_op(methods=("unfold",), first=True)
def sliding_windows(tr: Tracer, node: torch.fx.Node, x: Val | None) -> Val | None:
    """``x.unfold(dim, size, step)`` along a dim the symmetry does not act on (HaloNet's overlapping key/value
    windows): that dim becomes the window index and a new last dim the position in the window."""
    dim = node.kwargs.get("dimension", node.args[1] if len(node.args) > 1 else None)
    nd = x.ndim if x is not None else 0
    kept = other_dims(tr, node, x, {dim % nd} if isinstance(dim, int) and nd else set(range(nd)), "slides windows along")
    return kept if kept is None or kept.ndim != nd else kept.remap(lambda d: d, nd + 1)


def other_dims(tr: Tracer, node: torch.fx.Node, x: Val | None, touched: set[int], verb: str) -> Val | None:
    """``x`` unchanged by an op that acts on its dims ``touched`` only, unless they include the permuted dim or the
    per-head axis (then unsupported)."""
    if x is None or tr.all_frozen(x):
        return tr.frozen_val(node)
    if touched & {x.dim, x.outer}:
        return tr.unsupported(node, f"{verb} the permuted dim")
    return x


@node_op(operator.pow, torch.pow, methods=("pow",))
def power(tr: Tracer, node: torch.fx.Node) -> Val | None:
    """``x ** c`` with a number ``c`` (StarReLU's ``relu(x) ** 2``): elementwise."""
    base, exponent = (node.args + (None,))[:2]
    if isinstance(exponent, torch.fx.Node) or not isinstance(base, torch.fx.Node):
        return tr.unsupported(node, "a power with a tensor exponent or a number base")
    return elementwise(tr, node, tr.value(base))


@node_op(torch.mean, torch.sum, torch.amax, torch.amin, methods=("mean", "sum", "amax", "amin"), first=True)
def reduce(tr: Tracer, node: torch.fx.Node, x: Val | None) -> Val | None:
    dims = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    return reduced(tr, node, x, dims, node.kwargs.get("keepdim", node.args[2] if len(node.args) > 2 else False))


@node_op(torch.norm, torch.linalg.vector_norm, methods=("norm",), first=True)
def vector_norm(tr: Tracer, node: torch.fx.Node, x: Val | None) -> Val | None:
    """``x.norm(p, dim, keepdim)`` / ``torch.linalg.vector_norm(x, ord, dim, keepdim)`` (ConvNeXt-V2's global
    response norm over the spatial dims): a symmetric function of the entries it reduces, like :func:`reduce`."""
    dims = node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else None)
    return reduced(tr, node, x, dims, node.kwargs.get("keepdim", node.args[3] if len(node.args) > 3 else False))


def reduced(tr: Tracer, node: torch.fx.Node, x: Val | None, dims, keepdim: bool) -> Val | None:
    """``x`` reduced over ``dims`` (None: all) by a function symmetric in the reduced entries."""
    if x is None:
        return tr.frozen_val(node)
    if dims is None:
        return tr.frozen_val(node)  # full reduction: a scalar, invariant under every permutation
    dims = {d % x.ndim for d in (dims if isinstance(dims, (tuple, list)) else (dims,))}
    if x.dim in dims:
        return tr.frozen_val(node)  # sum/mean over units is permutation-invariant
    nd = shape_len(node, x.ndim)
    if x.outer in dims and not tr.all_frozen(x):  # summing the heads (ResNeSt's radix): one permutation for all
        if not tr.join_heads(node, x):
            return tr.unsupported(node, "reduces over the axis indexing per-head spaces of different layouts")
        return Val(x.dim if keepdim else x.dim - sum(r < x.dim for r in dims), nd, x.segs[:1])
    return x.remap(lambda d: d if keepdim else d - sum(r < d for r in dims), nd)
