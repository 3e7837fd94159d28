"""Symmetry rules for functions that libraries hide from torch.fx with ``torch.fx.wrap`` (one opaque node each).

Each rule reads the node's arguments the way the library's function does and returns the traced value of its
output; :func:`library_rules` lists the rules of the libraries already imported (nothing is imported here).

- torchvision ``stochastic_depth``: elementwise (a per-sample Bernoulli scale in training, the identity in eval).
- torchvision Swin ``shifted_window_attention``: windowed self-attention with a fused qkv projection — the
  rule of :func:`~modeconn.symmetry.trace.ops.attention.fused_self_attention` (per-head query/key and value spaces).
  The relative-position bias is indexed by head and token pair, never by a feature, so permutations within a
  head leave it unchanged (``_get_relative_position_bias``: a constant of the model).
- torchvision Swin ``_patch_merging_pad``: four strided 2×2 sub-grids concatenated along channels (channels-last),
  so the output carries the input's spaces four times.

- timm ``apply_rot_embed_cat`` (traced as one node, :func:`modeconn.symmetry.trace.leaves.fx_trace`): rotary position
  embedding; the query/key dims it rotates stay fixed. ``_build_grid`` / ``_apply_coord_augs``: constants.

Layer subclasses with a ``forward`` of their own that keep their base layer's symmetry (:func:`library_modules`; any
other such subclass is traced into, see :func:`modeconn.symmetry.trace.leaves.rule_leaf`):

- timm's weight-standardised convolutions (``StdConv2d``, ``ScaledStdConv2d`` and their ``Same`` variants) normalise
  each output row of the kernel over its inputs (a function of the row's entries that any permutation of the inputs
  leaves alike), timm's ``Conv2dSame`` pads by the input size: ``nn.Conv2d``'s rule;
- modeconn's W-asymmetric ``AsymLinear`` / ``AsymConv2d`` (kernel ``F + D ⊙ W``) and the fixed gate ``FiGLU``: their
  base's rule (``nn.Linear``, ``nn.Conv2d``, elementwise) at their symmetric fixed structure, at which the self-check
  runs them (``symmetric_fixed_structure``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch.fx
from torch import nn

from .ops.elementwise import elementwise
from .tracer import Tracer
from .values import Attr, Val

Rule = Callable[[Tracer, torch.fx.Node], Any]

_SWIN_ARGS = ("input", "qkv_weight", "proj_weight", "relative_position_bias", "window_size", "num_heads", "shift_size",
              "attention_dropout", "dropout", "qkv_bias", "proj_bias", "logit_scale", "training")


def _arguments(node: torch.fx.Node, names: tuple[str, ...]) -> dict[str, Any]:
    return dict(zip(names, node.args, strict=False)) | {k: v for k, v in node.kwargs.items() if k in names}


def _key(tr: Tracer, arg: Any) -> str | None:
    a = tr.vals.get(arg) if isinstance(arg, torch.fx.Node) else None
    return a.key if isinstance(a, Attr) else None


def swin_attention(tr: Tracer, node: torch.fx.Node) -> Val | None:
    """``shifted_window_attention(x (B, H, W, C), qkv_weight (3C, C), proj_weight (C, C), bias, …)``."""
    args = _arguments(node, _SWIN_ARGS)
    x = tr.value(args["input"])
    keys = {k: _key(tr, args.get(k)) for k in ("qkv_weight", "qkv_bias", "proj_weight", "proj_bias")}
    missing = [k for k in ("qkv_weight", "proj_weight") if keys[k] is None] + [
        k for k in ("qkv_bias", "proj_bias") if args.get(k) is not None and keys[k] is None]
    if x is None or missing:
        return tr.unsupported(node, f"windowed attention whose {missing or 'input'} is not a parameter of the model")
    tr.value(args["relative_position_bias"])
    name = keys["proj_weight"].rsplit(".", 1)[0]
    return tr.fused_self_attention(node, name, x, int(args["num_heads"]), (keys["qkv_weight"], keys["qkv_bias"]),
                                   (keys["proj_weight"], keys["proj_bias"]))


def constant(tr: Tracer, node: torch.fx.Node) -> Val | None:
    """A function of the model's parameters and buffers that no permutation acts on (Swin's relative-position bias
    gathered from its table; Swin V2's computed by a small MLP first): an unpermuted value; what it reads is never
    permuted."""
    for a in node.args:
        if isinstance(a, torch.fx.Node):
            tr.freeze(tr.vals.get(a))
    return tr.frozen_val(node)


def patch_merging_pad(tr: Tracer, node: torch.fx.Node) -> Val | None:
    """``cat([x[..., 0::2, 0::2, :], x[..., 1::2, 0::2, :], …], -1)`` of a channels-last ``x``."""
    x = tr.value(node.args[0])
    if x is None or tr.all_frozen(x):
        return tr.frozen_val(node)
    if x.dim != x.ndim - 1 or x.outer is not None:
        return tr.unsupported(node, "patch merging of a value whose symmetry is not on its last (channel) dim")
    return Val(x.dim, x.ndim, x.segs * 4)


def rotary(tr: Tracer, node: torch.fx.Node) -> Val | None:
    """``apply_rot_embed_cat(x, emb)``: rotary position embedding of queries or keys. It rotates pairs of a head's
    dims by position-dependent angles, so a permutation of those dims keeps q·k only if it maps every pair, in order,
    onto a pair rotated by the same angles at every position (at most an exchange of pairs of equal frequency on the
    same axis); none is offered: the query/key spaces stay fixed, the output carries x's (now frozen) spaces."""
    x = tr.value(node.args[0])
    for a in (node.args[0], *node.args[1:2], node.kwargs.get("emb")):
        if isinstance(a, torch.fx.Node):
            tr.freeze(tr.vals.get(a))
    return x if x is not None else tr.frozen_val(node)


def first_elementwise(tr: Tracer, node: torch.fx.Node) -> Val | None:
    return elementwise(tr, node, tr.arg_val(node))


_LIBRARY: dict[str, dict[str, Rule]] = {
    "torchvision.ops.stochastic_depth": {"stochastic_depth": first_elementwise},
    "timm.layers.pos_embed_sincos": {"apply_rot_embed_cat": rotary, "_build_grid": constant,
                                     "_apply_coord_augs": constant},
    "torchvision.models.swin_transformer": {"shifted_window_attention": swin_attention,
                                            "_get_relative_position_bias": constant,
                                            "_patch_merging_pad": patch_merging_pad},
}


_LIBRARY_MODULES: dict[str, dict[str, type | str]] = {
    "timm.layers.std_conv": {"StdConv2d": nn.Conv2d, "StdConv2dSame": nn.Conv2d, "ScaledStdConv2d": nn.Conv2d,
                             "ScaledStdConv2dSame": nn.Conv2d},
    "timm.layers.conv2d_same": {"Conv2dSame": nn.Conv2d},
    "modeconn.models.asymmetric": {"AsymLinear": nn.Linear, "AsymConv2d": nn.Conv2d},
    "modeconn.models.gating": {"FiGLU": "elementwise"},
}


def library_modules() -> dict[type, type | str]:
    """The layer types above of the library modules already imported (class → stock layer type or ``"elementwise"``)."""
    return {cls: rule for module, classes in _LIBRARY_MODULES.items()
            for name, rule in classes.items()
            if isinstance(cls := getattr(sys.modules.get(module), name, None), type)}


def library_rules() -> dict[Callable, Rule]:
    """The rules above for the functions of the library modules already imported (function object → rule)."""
    rules: dict[Callable, Rule] = {}
    for module, functions in _LIBRARY.items():
        mod = sys.modules.get(module)
        for fname, rule in functions.items():
            fn = getattr(mod, fname, None) if mod is not None else None
            if callable(fn):
                rules[fn] = rule
    return rules
