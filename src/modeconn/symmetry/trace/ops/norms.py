"""Norms: BatchNorm, LayerNorm, GroupNorm (one group or one per channel) and their functional forms. A norm over
the permuted dim commutes with its permutation when its affine and statistics move with it (bound output side)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.fx
import torch.nn.functional as F
from torch import nn

from ..registry import module_op, node_op
from ..values import Attr, Val, target_name

if TYPE_CHECKING:
    from ..tracer import Tracer

NORM_MODULES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)
FUNCTIONAL_NORM_WEIGHT = {F.batch_norm: (3, "weight"), F.layer_norm: (2, "weight")}
"""Functional norms: the position and name of their affine ``weight`` argument."""


@module_op(*NORM_MODULES)
def norm_module(tr: Tracer, node: torch.fx.Node, name: str, mod: nn.Module, x: Val) -> Val | None:
    return tr.norm(node, name, mod, x)  # the tracer's method (:func:`norm`): a test may substitute a broken rule


def norm(tr: Tracer, node: torch.fx.Node, name: str, mod: nn.Module, x: Val) -> Val | None:
    if isinstance(mod, nn.LayerNorm):
        first = x.ndim - len(mod.normalized_shape)
        axis = x.dim - first if x.dim >= first else None
    elif isinstance(mod, nn.GroupNorm):
        x = group_preserving(tr, node, tr.require_dim(node, x, 1), mod.num_groups)
        if x is None:
            return tr.frozen_val(node)
        axis = 0
    else:
        x = tr.require_dim(node, x, 1)
        axis = 0
    if axis is not None:
        keys = [k for k, _ in mod.named_parameters(recurse=False)] + [
            k for k, b in mod.named_buffers(recurse=False) if b is not None and b.is_floating_point()
        ]
        for k in keys:
            tr.bind(f"{name}.{k}", axis, x, "out")
    return x


@node_op(F.layer_norm)
def functional_layer_norm(tr: Tracer, node: torch.fx.Node) -> Val | None:
    """``F.layer_norm(x, normalized_shape, weight, bias, eps)`` (e.g. inside a channels-last norm's forward):
    normalising over the permuted dim commutes with its permutation when ``weight``/``bias`` move with it
    (bound like :func:`norm`'s); over other dims they are constant along it."""
    names = ("input", "normalized_shape", "weight", "bias", "eps")
    args = dict(zip(names, node.args, strict=False)) | {k: v for k, v in node.kwargs.items() if k in names}
    x = tr.value(args["input"])
    if x is None or tr.all_frozen(x):
        for k in ("weight", "bias"):
            tr.value(args.get(k))
        return x if x is not None else tr.frozen_val(node)
    shape = args["normalized_shape"]
    n = len(shape) if isinstance(shape, (tuple, list, torch.Size)) else 1
    first = x.ndim - n
    if x.dim < first:
        return x
    for k in ("weight", "bias"):
        a = tr.vals.get(args.get(k)) if isinstance(args.get(k), torch.fx.Node) else None
        if isinstance(a, Attr) and a.key is not None:
            tr.bind(a.key, a.stored_axis(x.dim - first), x, "out")
        elif args.get(k) is not None:
            return tr.unsupported(node, f"layer_norm {k} is not a parameter of the model")
    return x


@node_op(F.batch_norm)
def functional_batch_norm(tr: Tracer, node: torch.fx.Node) -> Val | None:
    """``F.batch_norm(x, running_mean, running_var, weight, bias, …)`` (timm's ``BatchNormAct2d`` forward): per
    channel (dim 1), so its statistics and affine move with the channels' permutation."""
    return channel_norm(tr, node, ("input", "running_mean", "running_var", "weight", "bias"))


@node_op(F.group_norm)
def functional_group_norm(tr: Tracer, node: torch.fx.Node) -> Val | None:
    """``F.group_norm(x, num_groups, weight, bias, eps)`` (timm's ``GroupNorm1``): with one group (statistics over
    all channels) or one per channel it commutes with channel permutations; its affine moves with them."""
    names = ("input", "num_groups", "weight", "bias")
    groups = dict(zip(names, node.args, strict=False)).get("num_groups", node.kwargs.get("num_groups"))
    x = tr.value(node.args[0]) if node.args else None
    if isinstance(groups, int) and x is not None and group_preserving(tr, node, x, groups) is None:
        return tr.frozen_val(node)
    return channel_norm(tr, node, names)


def group_preserving(tr: Tracer, node: torch.fx.Node, x: Val, groups: int) -> Val | None:
    """``x`` (channels on dim 1) with its spaces split at the boundaries of ``groups`` consecutive channel groups, whose
    statistics a group norm shares: permutations within each group commute with it (as grouped convolutions' group-
    preserving permutations do; whole groups do not move). One group or one per channel needs no split. None after
    :meth:`~.tracer.Tracer.unsupported` where the groups cut through a unit or a space split differently."""
    if groups == 1 or tr.all_frozen(x) or x.width == groups:
        return x
    size = x.width // groups
    split = tr.refine(x, {size * i for i in range(1, groups)}) if x.width % groups == 0 else None
    if split is None:
        tr.unsupported(node, f"group norm with {groups} groups of a {x.width}-channel input whose spaces cannot be "
                             "split at the groups' boundaries")
    return split


def channel_norm(tr: Tracer, node: torch.fx.Node, names: tuple[str, ...]) -> Val | None:
    """A functional per-channel (dim 1) norm whose tensor arguments ``names[1:]`` (parameters or buffers, or
    non-tensors) move with the channels."""
    args = dict(zip(names, node.args, strict=False)) | {k: v for k, v in node.kwargs.items() if k in names}
    x = tr.value(args["input"])
    if x is None:
        return tr.frozen_val(node)
    x = tr.require_dim(node, x, 1)
    for k in names[1:]:
        arg = args.get(k)
        a = tr.vals.get(arg) if isinstance(arg, torch.fx.Node) else None
        if isinstance(a, Attr) and a.key is not None:
            tr.bind(a.key, a.stored_axis(0), x, "out")
        elif isinstance(arg, torch.fx.Node):
            return tr.unsupported(node, f"{target_name(node)} {k} is not a parameter or buffer of the model")
    return x
