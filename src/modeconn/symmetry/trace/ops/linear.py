"""Writers: Linear, convolutions (groups=1, depthwise, grouped) and ``F.linear``. A writer binds its weight's
input axis to its input's spaces and creates a new space for its output."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.fx
import torch.nn.functional as F
from torch import nn

from ...spec import AxisBinding, Probe
from ..registry import module_op, node_op
from ..values import Attr, AttrCat, Pair, Seg, Val, offsets, shape_len

if TYPE_CHECKING:
    from ..tracer import Tracer


@module_op(nn.Linear, per_head=True)
def linear(tr: Tracer, node: torch.fx.Node, name: str, mod: nn.Module, x: Val) -> Val | None:
    if x.ndim - 1 not in (x.dim, x.outer) and not tr.all_frozen(x):
        return x  # mixes along a dim no permutation acts on (MLP-Mixer's token mixing): x's spaces pass; its own stay fixed
    if tr.has_heads(x):
        return tr.refuse_heads(node, mod, x)
    return writer(tr, node, name, x, x.ndim - 1, mod.out_features, in_axis=1)


def writer(tr: Tracer, node: torch.fx.Node, name: str, x: Val, dim: int, n_out: int, in_axis: int | None) -> Val:
    x = tr.require_dim(node, x, dim)
    if in_axis is not None:
        tr.bind(f"{name}.weight", in_axis, x, "in")
        tr.probes.extend((s.space, Probe(name, "input", dim, off, s.block)) for s, off in offsets(x))
    space = tr.module_out_space(name, n_out)
    out = Val(dim, shape_len(node, x.ndim), (Seg(space, n_out),))
    for key in tr.output_parameters(name, n_out):
        tr.bind(key, 0, out, "out")
    tr.writers.append((name, space, node))
    tr.out_probes.append((space, Probe(name, "output", out.dim)))
    return out


def output_parameters(tr: Tracer, name: str, n_out: int) -> list[str]:
    """A writer's tensors indexed by its output along axis 0: ``weight``, ``bias``, and in Linear / Conv subclasses
    any other parameter of shape (n_out, 1, …) (timm's ``ScaledStdConv2d`` gain)."""
    mod = tr.modules[name]
    keys = [f"{name}.weight"] + ([f"{name}.bias"] if getattr(mod, "bias", None) is not None else [])
    for k, p in mod.named_parameters(recurse=False):
        if k not in ("weight", "bias") and p.dim() >= 1 and p.shape[0] == n_out and p.numel() == n_out:
            keys.append(f"{name}.{k}")
    return keys


@module_op(nn.Conv1d, nn.Conv2d, nn.Conv3d)
def conv(tr: Tracer, node: torch.fx.Node, name: str, mod: nn.Module, x: Val) -> Val | Pair | None:
    if x.dim >= 2 and not tr.inactive(x) and pointwise_along(mod, x.dim - 2):
        return conv_across_units(tr, node, name, mod, x)
    x = tr.require_dim(node, x, 1)
    if mod.groups == 1:
        if any(s.block != 1 for s in x.segs):
            return tr.unsupported(node, "convolution over a flattened input")
        return writer(tr, node, name, x, 1, mod.out_channels, in_axis=1)
    if mod.groups == mod.in_channels == mod.out_channels:  # depthwise: each channel is its own group
        for key in tr.output_parameters(name, mod.out_channels):
            tr.bind(key, 0, x, "out")
        return x
    return grouped_conv(tr, node, name, mod, x)


def pointwise_along(mod: nn.Module, axis: int) -> bool:
    """Whether a convolution treats every index of its spatial ``axis`` alike and apart: kernel 1, stride 1, no padding."""
    pad = mod.padding if isinstance(mod.padding, tuple) else None
    return axis < len(mod.kernel_size) and mod.kernel_size[axis] == 1 and mod.stride[axis] == 1 and (
        pad is None or pad[axis] == 0) and mod.groups == 1


def conv_across_units(tr: Tracer, node: torch.fx.Node, name: str, mod: nn.Module, x: Val) -> Pair:
    """A convolution whose input is permuted along a spatial dim it convolves pointwise (LambdaNet's position lambdas:
    ``Conv3d`` over (B, 1, H, W, value dims) with a kernel (r, r, 1)): that dim's units pass through unmixed, and the
    output channels are a new space; the product carries both."""
    channels = Val(1, x.ndim, (Seg(tr.new_space(mod.in_channels, name, frozen=True), mod.in_channels),))
    return Pair((writer(tr, node, name, channels, 1, mod.out_channels, in_axis=None), x))


def grouped_conv(tr: Tracer, node: torch.fx.Node, name: str, mod: nn.Module, x: Val) -> Val | None:
    """A convolution with ``g`` groups (ResNeXt, RegNet): each group reads its own input channels. Group-
    preserving permutations: the output channels of every group permuted independently (the output space split
    into ``g`` parts); the input channels permuted alike in every group (the input space split into ``g`` parts,
    joined), since the weight's input axis is shared by all groups. Whole groups do not move."""
    g = mod.groups
    if len(x.segs) != 1 or x.segs[0].block != 1 or x.outer is not None:
        return tr.unsupported(node, f"grouped convolution (groups={g}) over a concatenated or flattened input")
    parts = tr.split(x.segs[0].space, g)
    if parts is None:
        return tr.unsupported(node, f"grouped convolution (groups={g}): its input space is already split differently")
    for p in parts[1:]:
        tr.union(parts[0], p, node)
    tr.bind(f"{name}.weight", 1, Val(1, x.ndim, (Seg(parts[0], mod.in_channels // g),)), "in")
    space = tr.module_out_space(name, mod.out_channels)
    tr.split(space, g)
    out = Val(1, shape_len(node, x.ndim), (Seg(space, mod.out_channels),))
    for key in tr.output_parameters(name, mod.out_channels):
        tr.bind(key, 0, out, "out")
    tr.writers.append((name, space, node))
    tr.out_probes.append((space, Probe(name, "output", 1)))
    return out


@node_op(F.linear)
def functional_linear(tr: Tracer, node: torch.fx.Node) -> Val | None:
    """``F.linear(x, weight, bias)`` with the model's ``weight`` (BEiT's ``F.linear(x, qkv.weight, qkv_bias)``):
    like a Linear layer; a concatenated bias (:class:`AttrCat`) splits the output space into its parts, each bound
    to its tensor, and a constant part outside the state dict needs no binding (any other freezes its part)."""
    args = dict(zip(("input", "weight", "bias"), node.args, strict=False)) | dict(node.kwargs)
    x, w = tr.value(args["input"]), tr.vals.get(args["weight"]) if isinstance(args.get("weight"), torch.fx.Node) else None
    b = tr.vals.get(args.get("bias")) if isinstance(args.get("bias"), torch.fx.Node) else None
    if x is None or not isinstance(w, Attr) or w.key is None or x.outer is not None or (
            args.get("bias") is not None and not (isinstance(b, AttrCat) or isinstance(b, Attr) and b.key is not None)):
        return tr.unsupported(node, "linear whose weight or bias is not a parameter of the model, or of per-head values")
    x = tr.require_dim(node, x, x.ndim - 1)
    tr.bind(w.key, 1, x, "in")
    space = tr.module_out_space(w.key.rsplit(".", 1)[0], w.shape[0])
    out = Val(x.dim, shape_len(node, x.ndim), (Seg(space, w.shape[0]),))
    tr.bind(w.key, 0, out, "out")
    if isinstance(b, Attr):
        tr.bind(b.key, 0, out, "out")
    elif isinstance(b, AttrCat):
        children = tr.split_at(space, [n for _, n, _ in b.parts])
        if children is None:
            return tr.unsupported(node, "a concatenated bias whose parts cut the output space differently")
        for (a, _, constant), child in zip(b.parts, children, strict=True):
            if a.key is not None:
                tr.bindings.append((a.key, AxisBinding(0, "", "out", 1, 0, False), child))
            elif not constant:
                tr.set_frozen(child)
    return out
