"""Automatic symmetry specs from a torch.fx trace.

One pass over the fx graph in topological order. Every tensor value carries the dimension on which a
symmetry acts (``dim``) and its layout along that dimension: a list of segments, each a union-find
space id with a size and a ``block`` (entries per unit; > 1 after conv → flatten). Writers (Linear,
Conv) create a space per module; readers bind their input axis to the spaces of their input value;
residual additions and other elementwise binary ops *union* the spaces of their operands; the model's
inputs and outputs are *frozen* spaces, and anything unioned with a frozen space is frozen too.
Frozen spaces are dropped at the end: their axes stay unbound (never permuted).

Per-head spaces (attention): a reshape that splits the permuted dim into (groups, width), e.g.
``q.unflatten(-1, (heads, head_dim))``, *splits* each space into ``heads`` child spaces of size ``head_dim``
(the group is restricted to permutations within each head) and the value records the axis indexing the
children (``_Val.outer``). Bindings made before or after the split are expanded to one partial binding per
child at offset ``i · head_dim`` when the spec is built. ``q @ kᵀ`` contracts the per-head dims, so it unions
q's and k's child spaces head by head (QKᵀ is invariant under a joint permutation) and its result carries no
symmetry; ``attn @ v`` keeps v's per-head spaces, and merging the heads again (``flatten``) lays them out
along the feature dim for ``o_proj``. Permutations of whole heads are not modelled (a later head-permutation
group); every space here is a plain permutation space.

Parameters read by ``get_attr`` and combined elementwise with activations (a positional embedding added to
tokens, a per-feature scale) are bound, on the axis broadcast against the permuted dim, to the activations'
spaces (output side, like a bias); read anywhere else they stay unbound and, if also bound somewhere, their
spaces are frozen.

Supported: Linear, Conv1d/2d/3d (groups=1 or depthwise), BatchNorm1d/2d/3d, LayerNorm, GroupNorm
(1 group or one per channel), PReLU, elementwise activations, softmax, dropout, pooling, flatten / view /
reshape that merges adjacent dimensions or splits the permuted one into (groups, width), unflatten,
permute / transpose, mean/sum/amax reductions, residual additions and products, parameters added to
activations, matmul / bmm, concatenation. Anything else raises :class:`UnsupportedOperationError` naming
the node, or with ``on_unsupported="freeze"`` freezes every space touching it.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .._util.modes import eval_mode
from ..errors import ConfigError, SpecError, TraceError, UnsupportedOperationError
from .selfcheck import check_examples, check_function_preserved, perturbed_state, propagate_shapes
from .spec import AxisBinding, Probe, Space, SymmetrySpec

OnUnsupported = Literal["error", "freeze"]


@dataclass(frozen=True)
class _Seg:
    space: int
    n: int
    block: int = 1


@dataclass(frozen=True)
class _Val:
    """A tensor value: symmetry acts on ``dim``, laid out as ``segs`` along it.

    With ``outer`` set (per-head values, e.g. (N, heads, T, head_dim)), ``segs[i]`` is the whole layout of
    ``dim`` at index ``i`` of axis ``outer``: a different space per head, and ``len(segs) == shape[outer]``.
    """

    dim: int
    ndim: int
    segs: tuple[_Seg, ...]
    outer: int | None = None

    @property
    def width(self) -> int:
        return sum(s.n * s.block for s in self.segs)

    def remap(self, axis: Callable[[int], int], ndim: int) -> _Val:
        """The same spaces after the axes moved (``axis(old) -> new``) in a tensor of ``ndim`` dims."""
        return _Val(axis(self.dim), ndim, self.segs, None if self.outer is None else axis(self.outer))


@dataclass(frozen=True)
class _Parts:
    """A tensor whose slices along ``axis`` carry different values: a fused q/k/v projection reshaped to
    (…, 3, heads, head_dim) (timm's ViT). ``vals[i]`` is slice ``i``'s value in the coordinates of the whole tensor;
    only moving axes (permute/transpose) and taking the slices apart (``unbind``, ``x[i]``) keep it."""

    axis: int
    vals: tuple[_Val, ...]

    def remap(self, axis: Callable[[int], int], ndim: int) -> _Parts:
        return _Parts(axis(self.axis), tuple(v.remap(axis, ndim) for v in self.vals))

    def take(self, i: int) -> _Val:
        """Slice ``i`` with the part axis removed."""
        v = self.vals[i]
        return v.remap(lambda d: d - (d > self.axis), v.ndim - 1)


@dataclass(frozen=True)
class _AttrCat:
    """A 1-D concatenation of tensors read by ``get_attr`` (BEiT's q/k/v bias ``cat((q_bias, k_bias, v_bias))``, its
    ``k_bias`` a constant buffer outside the state dict): ``parts`` = (tensor, length, constant along its length)."""

    parts: tuple[tuple[_Attr, int, bool], ...]


@dataclass(frozen=True)
class _Attr:
    """A tensor read by a ``get_attr`` node: a parameter/buffer ``key`` of the state dict, or ``None`` for a
    tensor outside it (which can never be permuted)."""

    key: str | None
    shape: tuple[int, ...]
    stored: tuple[int, ...] | None = None  # the stored shape when ``shape`` is a view adding/removing size-1 dims

    def stored_axis(self, axis: int) -> int:
        """The axis of the stored tensor that axis ``axis`` of this (possibly reshaped) view is."""
        if self.stored is None:
            return axis
        rank = sum(1 for d in self.shape[:axis] if d != 1)
        return [i for i, d in enumerate(self.stored) if d != 1][rank]


_ELEMENTWISE_MODULES = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.SELU, nn.CELU,
    nn.Softplus, nn.Mish, nn.Hardswish, nn.Hardtanh, nn.Hardsigmoid, nn.Identity, nn.Dropout, nn.Dropout1d,
    nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.Softsign, nn.Tanhshrink, nn.LogSigmoid,
)
_POOL_MODULES = (
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d, nn.Upsample,
)
_NORM_MODULES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)
_RULE_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.PReLU, nn.Flatten, nn.Softmax, nn.LogSoftmax,
                 nn.MultiheadAttention, *_NORM_MODULES, *_ELEMENTWISE_MODULES, *_POOL_MODULES)
_ELEMENTWISE_FUNCTIONS = {
    F.relu, F.relu6, F.leaky_relu, F.gelu, F.silu, F.elu, F.selu, F.celu, F.softplus, F.mish, F.hardswish,
    F.hardtanh, F.hardsigmoid, F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.logsigmoid,
    torch.relu, torch.tanh, torch.sigmoid, torch.exp, torch.abs, torch.neg, torch.square, torch.sqrt,
    operator.neg, torch.clamp, torch.clip,
}
_ELEMENTWISE_METHODS = {
    "relu", "relu_", "tanh", "sigmoid", "exp", "abs", "neg", "square", "sqrt", "clamp", "clip",
    "contiguous", "clone", "detach", "float", "double", "half", "bfloat16", "to", "type_as",
}
_POOL_FUNCTIONS = {
    F.max_pool1d, F.max_pool2d, F.max_pool3d, F.avg_pool1d, F.avg_pool2d, F.avg_pool3d,
    F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d,
    F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d, F.interpolate,
}
_BINARY = {operator.add, operator.sub, operator.mul, operator.truediv, operator.iadd, operator.imul,
           torch.add, torch.sub, torch.mul, torch.div, torch.maximum, torch.minimum}
_BINARY_METHODS = {"add", "add_", "sub", "mul", "mul_", "div", "maximum", "minimum"}
_REDUCE_FUNCTIONS = {torch.mean, torch.sum, torch.amax, torch.amin}
_REDUCE_METHODS = {"mean", "sum", "amax", "amin"}
# softmax / log_softmax commute with permutations of every dim, their own included (the normaliser is a
# symmetric function); an orthogonal or scaling group would need its own rule here
_SOFTMAX_FUNCTIONS = {F.softmax, F.log_softmax, torch.softmax, torch.log_softmax}
_SOFTMAX_METHODS = {"softmax", "log_softmax"}
_RESHAPE_FUNCTIONS = {torch.flatten, torch.reshape, torch.unflatten, torch.unsqueeze, torch.squeeze}
_RESHAPE_METHODS = {"flatten", "view", "reshape", "unflatten", "unsqueeze", "squeeze"}
_MATMUL = {operator.matmul, torch.matmul, torch.bmm}
_MATMUL_METHODS = {"matmul", "bmm"}
_NON_TENSOR_METHODS = {"size", "dim"}
# a parameter broadcast over the batch (a class token) or reshaped by size-1 dims (a layer scale): still that parameter
_PARAMETER_VIEW_METHODS = {"expand", "expand_as", "reshape", "view", "unsqueeze", "squeeze"}
_PARAMETER_VIEW_FUNCTIONS = {torch.reshape, torch.unsqueeze, torch.squeeze}
_OPERAND_RULES: tuple[tuple[set, set, str], ...] = (  # (methods, functions, _Tracer handler(node))
    (_BINARY_METHODS, _BINARY, "binary"),
    (_MATMUL_METHODS, _MATMUL, "matmul"),
    (set(), {torch.cat}, "cat"),
    (set(), {F.layer_norm}, "functional_layer_norm"),
    (set(), {F.batch_norm}, "functional_batch_norm"),
    (set(), {F.group_norm}, "functional_group_norm"),
    (set(), {F.linear}, "functional_linear"),
    ({"pow"}, {operator.pow, torch.pow}, "power"),
    ({"addcmul"}, {torch.addcmul}, "addcmul"),
    (set(), {F.scaled_dot_product_attention}, "attention_function"),
)
_UNARY_RULES: tuple[tuple[set, set, str], ...] = (  # (methods, functions, _Tracer handler(node, first operand))
    (_ELEMENTWISE_METHODS, _ELEMENTWISE_FUNCTIONS, "elementwise"),
    (_SOFTMAX_METHODS, _SOFTMAX_FUNCTIONS, "softmax"),
    (set(), _POOL_FUNCTIONS, "pool"),
    (_RESHAPE_METHODS, _RESHAPE_FUNCTIONS, "reshape"),
    (_REDUCE_METHODS, _REDUCE_FUNCTIONS, "reduce"),
    ({"permute", "transpose"}, {torch.permute, torch.transpose}, "permute"),
    ({"expand", "expand_as"}, set(), "expand"),
    (set(), {F.pad}, "pad"),
    ({"roll"}, {torch.roll}, "roll"),
    ({"chunk"}, {torch.chunk}, "chunk"),
    ({"split"}, {torch.split}, "split_sizes"),
)


def _matches(node: torch.fx.Node, methods: set, functions: set) -> bool:
    return node.target in (methods if node.op == "call_method" else functions)


class _Tracer:
    """Union-find over spaces (with splits into per-head children) plus the per-node value table."""

    def __init__(self, gm: torch.fx.GraphModule, on_unsupported: OnUnsupported, state_keys: frozenset[str] = frozenset()) -> None:
        self.gm = gm
        self.modules = dict(gm.named_modules())
        self.on_unsupported = on_unsupported
        self.state_keys = state_keys
        self.parent: list[int] = []
        self.size: list[int] = []
        self.frozen: list[bool] = []
        self.creator: list[str] = []
        self.children: dict[int, tuple[int, ...]] = {}  # split space (a root when split) → its consecutive parts
        self.module_space: dict[str, int] = {}
        self.bindings: list[tuple[str, AxisBinding, int]] = []  # (tensor key, binding with space placeholder, space id)
        self.bound_at: dict[tuple, int] = {}  # (key, axis, side, block, offset, units) → the space bound there
        self.probes: list[tuple[int, Probe]] = []
        self.out_probes: list[tuple[int, Probe]] = []  # writer outputs: probes for spaces no writer reads
        self.writers: list[tuple[str, int, torch.fx.Node]] = []
        self.attr_bound: dict[str, tuple[int, _Val]] = {}  # parameter key → (axis, activations it is bound with)
        self.attr_frozen: set[str] = set()  # parameter keys read where they cannot be permuted
        self.vals: dict[torch.fx.Node, Any] = {}

    # ---------------------------------------------------------------- union-find
    def new_space(self, n: int, creator: str, frozen: bool = False) -> int:
        self.parent.append(len(self.parent))
        self.size.append(n)
        self.frozen.append(frozen)
        self.creator.append(creator)
        return len(self.parent) - 1

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int, node: torch.fx.Node) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if self.size[ra] != self.size[rb]:
            where = repr(node.name) if node is not None else "a shared layer"
            raise TraceError(f"node {where} joins spaces of sizes {self.size[ra]} and {self.size[rb]}")
        parts: list[tuple[int, int]] = []
        if ra in self.children or rb in self.children:  # joining a split space: split the other alike, join part by part
            sizes = [self.size[c] for c in self.children.get(ra) or self.children[rb]]
            ka, kb = self.split_at(ra, sizes), self.split_at(rb, sizes)
            if ka is None or kb is None:  # split into different parts: only the identity fits both
                self.set_frozen(ra)
                self.set_frozen(rb)
                return
            parts = list(zip(ka, kb, strict=False))
        ra, rb = min(ra, rb), max(ra, rb)
        self.parent[rb] = ra
        frozen = self.frozen[ra] or self.frozen[rb]
        for pa, pb in parts:
            self.union(pa, pb, node)
        if frozen:
            self.set_frozen(ra)

    def split(self, sid: int, k: int) -> tuple[int, ...] | None:
        """The ``k`` equal consecutive parts of space ``sid`` (created on first use); ``None`` if it is already
        split differently or its size is not a multiple of ``k``. Splitting restricts the space's group to
        permutations within each part (always safe: a subgroup of a symmetry group is a symmetry group)."""
        n = self.size[self.find(sid)]
        return None if n % k else self.split_at(sid, [n // k] * k)

    def split_at(self, sid: int, sizes: list[int]) -> tuple[int, ...] | None:
        """The consecutive parts of space ``sid`` of ``sizes`` (summing to its size; created on first use), or
        ``None`` if it is already split differently."""
        r = self.find(sid)
        if len(sizes) == 1:
            return (r,)
        if r in self.children:
            return self.children[r] if [self.size[c] for c in self.children[r]] == list(sizes) else None
        if sum(sizes) != self.size[r] or min(sizes) < 1:
            return None
        self.children[r] = tuple(self.new_space(n, f"{self.creator[r]}[{i}]", self.frozen[r]) for i, n in enumerate(sizes))
        return self.children[r]

    def leaves(self, sid: int, block: int, offset: int) -> list[tuple[int, int]]:
        """(root, offset) of each unsplit space making up ``sid``, in order along an axis where it starts at ``offset``."""
        r = self.find(sid)
        if r not in self.children:
            return [(r, offset)]
        out: list[tuple[int, int]] = []
        for c in self.children[r]:
            out += self.leaves(c, block, offset)
            offset += self.size[c] * block
        return out

    def set_frozen(self, sid: int) -> None:
        r = self.find(sid)
        self.frozen[r] = True
        for c in self.children.get(r, ()):
            self.set_frozen(c)

    def freeze(self, v: Any) -> None:
        if isinstance(v, _Attr):
            if v.key is not None:
                self.attr_frozen.add(v.key)
        elif isinstance(v, _Val):
            for s in v.segs:
                self.set_frozen(s.space)
        elif isinstance(v, _AttrCat):
            for a, _, _ in v.parts:
                self.freeze(a)
        elif isinstance(v, (_Parts, tuple)):
            for part in (v.vals if isinstance(v, _Parts) else v):
                self.freeze(part)

    def frozen_val(self, node: torch.fx.Node) -> _Val | None:
        shape = _shape(node)
        if shape is None:
            return None
        dim = 1 if len(shape) >= 2 else 0
        n = shape[dim] if shape else 1
        return _Val(dim, len(shape), (_Seg(self.new_space(n, node.name, frozen=True), n),))

    def all_frozen(self, x: _Val) -> bool:
        return all(self.frozen[self.find(s.space)] for s in x.segs)

    def inactive(self, x: _Val) -> bool:
        """No non-trivial permutation acts on ``x``: its spaces are frozen or of size 1."""
        return all(self.frozen[r] or self.size[r] == 1 for r in (self.find(s.space) for s in x.segs))

    # ---------------------------------------------------------------- bookkeeping
    def bind(self, key: str, axis: int, val: _Val, side: str) -> None:
        """Bind ``key``'s ``axis`` to ``val``'s spaces. A module called again (a shared layer: CoaT's positional
        conv, a norm applied twice) binds the same entries again: their spaces are joined, not bound twice."""
        offset = 0
        for s in val.segs:
            partial = len(val.segs) > 1
            where = (key, axis, side, s.block, offset, s.n)
            if where in self.bound_at:
                self.union(self.bound_at[where], s.space, None)
            else:
                self.bound_at[where] = s.space
                self.bindings.append((key, AxisBinding(axis, "", side, s.block, offset, partial), s.space))
            offset += s.n * s.block

    def module_out_space(self, name: str, n: int) -> int:
        if name not in self.module_space:
            self.module_space[name] = self.new_space(n, name)
        return self.module_space[name]

    def unsupported(self, node: torch.fx.Node, why: str) -> _Val | None:
        msg = f"unsupported operation at node {node.name!r} ({node.op} {_target_name(node)}{_module_of(node)}): {why}"
        layer = _layer_in_stack(node)
        if layer is not None and self.on_unsupported == "error":
            raise _untraceable_layer(*layer, msg)
        if self.on_unsupported == "error":
            raise UnsupportedOperationError(
                msg + ". Pass on_unsupported='freeze' to leave the spaces touching it unpermuted."
            )
        for a in _flat_args(node):
            self.freeze(self.vals.get(a))
        return self.frozen_val(node)

    # ---------------------------------------------------------------- main loop
    def run(self) -> None:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.vals[node] = self.frozen_val(node)
            elif node.op == "get_attr":
                shape = _shape(node)
                key = str(node.target)
                self.vals[node] = _Attr(key if key in self.state_keys else None, shape) if shape is not None else None
            elif node.op == "output":
                for a in _flat_args(node):
                    self.freeze(self.vals.get(a))
            elif node.op == "call_module":
                self.vals[node] = self.call_module(node)
            else:
                self.vals[node] = self.call_other(node)

    def value(self, a: Any) -> _Val | None:
        """The traced value of argument ``a``. A parameter read here (anywhere but as an elementwise operand
        of activations, see :meth:`parameter_operand`) is never permuted: it becomes a frozen value."""
        v = self.vals.get(a) if isinstance(a, torch.fx.Node) else None
        if isinstance(v, (_Attr, _AttrCat)):
            self.freeze(v)
            return self.frozen_val(a)
        return v

    def arg_val(self, node: torch.fx.Node, i: int = 0) -> _Val | None:
        return self.value(node.args[i]) if i < len(node.args) else None

    # ---------------------------------------------------------------- modules
    def call_module(self, node: torch.fx.Node) -> _Val | None:
        name = str(node.target)
        mod = self.modules[name]
        x = self.arg_val(node)
        if x is None or isinstance(x, _Parts):
            return self.unsupported(node, "module input is not a tensor" if x is None else "module reads a fused q/k/v value")
        if isinstance(mod, (nn.Softmax, nn.LogSoftmax)):
            return self.softmax_over(node, x, mod.dim)
        if isinstance(mod, _ELEMENTWISE_MODULES) or _registered(type(mod)) == "elementwise":
            return x
        if isinstance(mod, nn.Flatten):
            return self.reshape(node, x)
        if isinstance(mod, nn.MultiheadAttention):
            return self.multihead_attention(node, name, mod, x)
        if isinstance(mod, nn.Linear) and x.ndim - 1 not in (x.dim, x.outer) and not self.all_frozen(x):
            return x  # mixes along a dim no permutation acts on (MLP-Mixer's token mixing): x's spaces pass; its own stay fixed
        if x.outer is not None and not self.all_frozen(x):
            return self.unsupported(node, f"{type(mod).__name__} on a value with a different space per index of axis {x.outer} "
                                    "(e.g. per attention head)")
        if isinstance(mod, nn.Linear):
            return self.writer(node, name, x, x.ndim - 1, mod.out_features, in_axis=1)
        if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            return self.conv(node, name, mod, x)
        if isinstance(mod, _NORM_MODULES):
            return self.norm(node, name, mod, x)
        if isinstance(mod, nn.PReLU):
            if mod.num_parameters > 1:
                self.bind(f"{name}.weight", 0, self.require_dim(node, x, 1), "out")
            return x
        if isinstance(mod, _POOL_MODULES):
            return self.require_dim(node, x, 1)
        return self.unsupported(node, f"module type {type(mod).__name__} has no symmetry rule")

    def require_dim(self, node: torch.fx.Node, x: _Val, dim: int) -> _Val:
        """Check the symmetry acts on ``dim`` of ``x`` (fully frozen values pass)."""
        dim = dim % x.ndim if x.ndim else 0
        if x.dim != dim and not self.all_frozen(x):
            raise UnsupportedOperationError(
                f"node {node.name!r} ({_target_name(node)}) acts on dim {dim} but the symmetry of its input "
                f"acts on dim {x.dim}"
            )
        return x

    def writer(self, node, name: str, x: _Val, dim: int, n_out: int, in_axis: int | None) -> _Val:
        x = self.require_dim(node, x, dim)
        if in_axis is not None:
            self.bind(f"{name}.weight", in_axis, x, "in")
            self.probes.extend((s.space, Probe(name, "input", dim, off, s.block)) for s, off in _offsets(x))
        space = self.module_out_space(name, n_out)
        out = _Val(dim, _shape_len(node, x.ndim), (_Seg(space, n_out),))
        for key in self.output_parameters(name, n_out):
            self.bind(key, 0, out, "out")
        self.writers.append((name, space, node))
        self.out_probes.append((space, Probe(name, "output", out.dim)))
        return out

    def output_parameters(self, name: str, n_out: int) -> list[str]:
        """A writer's tensors indexed by its output along axis 0: ``weight``, ``bias``, and in Linear / Conv subclasses
        any other parameter of shape (n_out, 1, …) (timm's ``ScaledStdConv2d`` gain)."""
        mod = self.modules[name]
        keys = [f"{name}.weight"] + ([f"{name}.bias"] if getattr(mod, "bias", None) is not None else [])
        for k, p in mod.named_parameters(recurse=False):
            if k not in ("weight", "bias") and p.dim() >= 1 and p.shape[0] == n_out and p.numel() == n_out:
                keys.append(f"{name}.{k}")
        return keys

    def conv(self, node, name: str, mod: nn.Module, x: _Val) -> _Val | None:
        x = self.require_dim(node, x, 1)
        if mod.groups == 1:
            if any(s.block != 1 for s in x.segs):
                return self.unsupported(node, "convolution over a flattened input")
            return self.writer(node, name, x, 1, mod.out_channels, in_axis=1)
        if mod.groups == mod.in_channels == mod.out_channels:  # depthwise: each channel is its own group
            for key in self.output_parameters(name, mod.out_channels):
                self.bind(key, 0, x, "out")
            return x
        return self.grouped_conv(node, name, mod, x)

    def grouped_conv(self, node, name: str, mod: nn.Module, x: _Val) -> _Val | None:
        """A convolution with ``g`` groups (ResNeXt, RegNet): each group reads its own input channels. Group-
        preserving permutations: the output channels of every group permuted independently (the output space split
        into ``g`` parts); the input channels permuted alike in every group (the input space split into ``g`` parts,
        joined), since the weight's input axis is shared by all groups. Whole groups do not move."""
        g = mod.groups
        if len(x.segs) != 1 or x.segs[0].block != 1 or x.outer is not None:
            return self.unsupported(node, f"grouped convolution (groups={g}) over a concatenated or flattened input")
        parts = self.split(x.segs[0].space, g)
        if parts is None:
            return self.unsupported(node, f"grouped convolution (groups={g}): its input space is already split differently")
        for p in parts[1:]:
            self.union(parts[0], p, node)
        self.bind(f"{name}.weight", 1, _Val(1, x.ndim, (_Seg(parts[0], mod.in_channels // g),)), "in")
        space = self.module_out_space(name, mod.out_channels)
        self.split(space, g)
        out = _Val(1, _shape_len(node, x.ndim), (_Seg(space, mod.out_channels),))
        for key in self.output_parameters(name, mod.out_channels):
            self.bind(key, 0, out, "out")
        self.writers.append((name, space, node))
        self.out_probes.append((space, Probe(name, "output", 1)))
        return out

    def multihead_attention(self, node, name: str, mod: nn.MultiheadAttention, x: _Val) -> tuple | None:
        """``nn.MultiheadAttention`` used for self-attention (query, key and value one tensor): the input's spaces
        on ``in_proj_weight``'s columns; per head, one space for the query/key dims (Q and K rows of the head, so
        ``q·k`` is invariant) and one for the value dims (V rows, ``out_proj`` columns); ``out_proj`` writes a new
        space. Returns ``(output, attention weights: no symmetry)`` like the module."""
        args = list(node.args) + [node.kwargs.get(k) for k in ("query", "key", "value") if k in node.kwargs]
        if len(args) < 3 or not (args[0] is args[1] is args[2]):
            return self.unsupported(node, "MultiheadAttention with different query, key and value (cross-attention)")
        if not mod._qkv_same_embed_dim or mod.bias_k is not None or mod.add_zero_attn:
            return self.unsupported(node, "MultiheadAttention with kdim/vdim, bias_k/bias_v or add_zero_attn")
        bias = mod.in_proj_bias is not None
        out = self.fused_self_attention(node, name, x, mod.num_heads, (f"{name}.in_proj_weight", f"{name}.in_proj_bias" if bias else None),
                                        (f"{name}.out_proj.weight", f"{name}.out_proj.bias" if mod.out_proj.bias is not None else None))
        return out if out is None else (out, None)

    def fused_self_attention(self, node, name: str, x: _Val, h: int, qkv: tuple[str, str | None],
                             proj: tuple[str, str | None]) -> _Val | None:
        """Self-attention with a fused input projection ``qkv`` = (weight (3e, e), bias (3e,) or None) and an output
        projection ``proj`` (weight (e, e), bias): x's spaces on qkv's columns; per head, one space for the query/key
        rows (so ``q·k`` is invariant) and one for the value rows and proj's columns; proj writes a new space."""
        x = self.require_dim(node, x, x.ndim - 1)
        if x.outer is not None:
            return self.unsupported(node, "self-attention on a value with per-head spaces")
        e = x.width
        self.bind(qkv[0], 1, x, "in")
        qk, vo = self.new_space(e, f"{name}.qk"), self.new_space(e, f"{name}.vo")
        self.split(qk, h)
        self.split(vo, h)
        for key in filter(None, qkv):
            for offset, space in ((0, qk), (e, qk), (2 * e, vo)):
                self.bindings.append((key, AxisBinding(0, "", "out", 1, offset, True), space))
        self.bindings.append((proj[0], AxisBinding(1, "", "in", 1, 0, False), vo))
        out = _Val(x.dim, x.ndim, (_Seg(self.module_out_space(name, e), e),))
        for key in filter(None, proj):
            self.bind(key, 0, out, "out")
        return out

    def norm(self, node, name: str, mod: nn.Module, x: _Val) -> _Val | None:
        if isinstance(mod, nn.LayerNorm):
            first = x.ndim - len(mod.normalized_shape)
            axis = x.dim - first if x.dim >= first else None
        elif isinstance(mod, nn.GroupNorm):
            x = self.require_dim(node, x, 1)
            if mod.num_groups not in (1, mod.num_channels):
                return self.unsupported(node, f"GroupNorm with {mod.num_groups} groups of a {mod.num_channels}-channel "
                                        "input only admits group-preserving permutations")
            axis = 0
        else:
            x = self.require_dim(node, x, 1)
            axis = 0
        if axis is not None:
            keys = [k for k, _ in mod.named_parameters(recurse=False)] + [
                k for k, b in mod.named_buffers(recurse=False) if b is not None and b.is_floating_point()
            ]
            for k in keys:
                self.bind(f"{name}.{k}", axis, x, "out")
        return x

    # ---------------------------------------------------------------- functions / methods
    def call_other(self, node: torch.fx.Node) -> Any:
        parts = [a for a in _flat_args(node) if isinstance(self.vals.get(a), _Parts)]
        if parts:
            return self.parts_op(node, self.vals[parts[0]]) if parts == [node.args[0]] else self.unsupported(
                node, "reads a fused q/k/v value other than by moving its axes or taking its parts apart")
        if node.op == "call_function" and node.target in LIBRARY_RULES:
            return LIBRARY_RULES[node.target](self, node)
        found, val = self.special(node)
        if found:
            return val
        # rules reading several operands first: they look at parameters before value() freezes them
        for methods, functions, handler in _OPERAND_RULES:
            if _matches(node, methods, functions):
                return getattr(self, handler)(node)
        x = self.arg_val(node)
        for methods, functions, handler in _UNARY_RULES:
            if _matches(node, methods, functions):
                return getattr(self, handler)(node, x)
        return self.unsupported(node, "no symmetry rule for this operation")

    def special(self, node: torch.fx.Node) -> tuple[bool, Any]:
        """``(True, value)`` for nodes decided before the operator tables: tuple elements, non-tensor values (sizes,
        Python arithmetic, ``torch._assert``), registered elementwise ops, views of parameters, tensor indexing."""
        t, is_method = node.target, node.op == "call_method"
        first = self.vals.get(node.args[0]) if node.args and isinstance(node.args[0], torch.fx.Node) else None
        if t is operator.getitem and isinstance(first, tuple):  # an element of a module's tuple output
            return True, first[node.args[1]]
        if _shape(node) is None and (is_method and t in _NON_TENSOR_METHODS or t is operator.getitem or t is getattr):
            return True, None
        if _shape(node) is None and not any(isinstance(self.vals.get(a), (_Val, _Attr)) for a in _flat_args(node)):
            return True, None  # Python arithmetic on sizes, torch._assert(h == ...): no tensor, no symmetry
        if not is_method and t in ELEMENTWISE_RULES:  # registered elementwise ops (stochastic depth, custom activations)
            return True, self.elementwise(node, self.arg_val(node))
        if isinstance(first, _Attr) and _matches(node, _PARAMETER_VIEW_METHODS, _PARAMETER_VIEW_FUNCTIONS):
            return True, first if t in ("expand", "expand_as") else self.parameter_view(node, first)
        if t is operator.getitem:
            return True, self.index(node)
        return False, None

    def elementwise(self, node: torch.fx.Node, x: _Val | None) -> _Val | None:
        return x if x is not None else self.frozen_val(node)

    def pool(self, node: torch.fx.Node, x: _Val | None) -> _Val | None:
        if x is None or self.all_frozen(x):
            return self.frozen_val(node)
        if x.outer is not None:
            return self.unsupported(node, "pooling a value with per-head spaces")
        return self.require_dim(node, x, 1)

    def parameter_view(self, node: torch.fx.Node, a: _Attr) -> _Attr | _Val | None:
        """A parameter reshaped by adding or removing size-1 dims (timm's layer scale ``gamma.reshape(1, -1, 1, 1)``):
        still that parameter, its axes mapped to the stored ones; any other reshape freezes it."""
        shape = _shape(node)
        if shape is None or a.key is None or [d for d in shape if d != 1] != [d for d in a.shape if d != 1]:
            return self.value(node.args[0])
        return _Attr(a.key, tuple(shape), a.stored or a.shape)

    def functional_layer_norm(self, node: torch.fx.Node) -> _Val | None:
        """``F.layer_norm(x, normalized_shape, weight, bias, eps)`` (e.g. inside a channels-last norm's forward):
        normalising over the permuted dim commutes with its permutation when ``weight``/``bias`` move with it
        (bound like :meth:`norm`'s); over other dims they are constant along it."""
        names = ("input", "normalized_shape", "weight", "bias", "eps")
        args = dict(zip(names, node.args, strict=False)) | {k: v for k, v in node.kwargs.items() if k in names}
        x = self.value(args["input"])
        if x is None or self.all_frozen(x):
            for k in ("weight", "bias"):
                self.value(args.get(k))
            return x if x is not None else self.frozen_val(node)
        shape = args["normalized_shape"]
        n = len(shape) if isinstance(shape, (tuple, list, torch.Size)) else 1
        first = x.ndim - n
        if x.dim < first:
            return x
        for k in ("weight", "bias"):
            a = self.vals.get(args.get(k)) if isinstance(args.get(k), torch.fx.Node) else None
            if isinstance(a, _Attr) and a.key is not None:
                self.bind(a.key, a.stored_axis(x.dim - first), x, "out")
            elif args.get(k) is not None:
                return self.unsupported(node, f"layer_norm {k} is not a parameter of the model")
        return x

    def functional_batch_norm(self, node: torch.fx.Node) -> _Val | None:
        """``F.batch_norm(x, running_mean, running_var, weight, bias, …)`` (timm's ``BatchNormAct2d`` forward): per
        channel (dim 1), so its statistics and affine move with the channels' permutation."""
        return self.channel_norm(node, ("input", "running_mean", "running_var", "weight", "bias"))

    def functional_group_norm(self, node: torch.fx.Node) -> _Val | None:
        """``F.group_norm(x, num_groups, weight, bias, eps)`` (timm's ``GroupNorm1``): with one group (statistics over
        all channels) or one per channel it commutes with channel permutations; its affine moves with them."""
        names = ("input", "num_groups", "weight", "bias")
        groups = dict(zip(names, node.args, strict=False)).get("num_groups", node.kwargs.get("num_groups"))
        shape = _shape(node)
        if shape is None or groups not in (1, shape[1]):
            return self.unsupported(node, f"group_norm with {groups} groups only admits group-preserving permutations")
        return self.channel_norm(node, names)

    def channel_norm(self, node: torch.fx.Node, names: tuple[str, ...]) -> _Val | None:
        """A functional per-channel (dim 1) norm whose tensor arguments ``names[1:]`` (parameters or buffers, or
        non-tensors) move with the channels."""
        args = dict(zip(names, node.args, strict=False)) | {k: v for k, v in node.kwargs.items() if k in names}
        x = self.value(args["input"])
        if x is None:
            return self.frozen_val(node)
        x = self.require_dim(node, x, 1)
        for k in names[1:]:
            arg = args.get(k)
            a = self.vals.get(arg) if isinstance(arg, torch.fx.Node) else None
            if isinstance(a, _Attr) and a.key is not None:
                self.bind(a.key, a.stored_axis(0), x, "out")
            elif isinstance(arg, torch.fx.Node):
                return self.unsupported(node, f"{_target_name(node)} {k} is not a parameter or buffer of the model")
        return x

    def addcmul(self, node: torch.fx.Node) -> _Val | None:
        """``torch.addcmul(beta, alpha, x)`` = ``beta + alpha·x`` with per-feature parameters (ResMLP's ``Affine``):
        both bound to x's spaces like biases (:meth:`parameter_operand`)."""
        operands = [a for a in node.args[:3] if isinstance(a, torch.fx.Node)]
        raw = [self.vals.get(a) for a in operands]
        acts = [(a, v) for a, v in zip(operands, raw, strict=True) if isinstance(v, _Val)]
        params = [(a, v) for a, v in zip(operands, raw, strict=True) if isinstance(v, _Attr)]
        if len(operands) != 3 or node.kwargs.get("value", 1) != 1 or len(acts) != 1 or len(params) != 2:
            return self.unsupported(node, "addcmul other than parameter + parameter · activations")
        (x_node, x), out = acts[0], acts[0][1]
        for p_node, p in params:
            out = self.parameter_operand(node, x_node, x, p_node, p)
        return out

    def binary(self, node: torch.fx.Node) -> _Val | None:
        """``a ∘ b`` elementwise (add, mul, …, broadcasting): a parameter operand is bound like a bias
        (:meth:`parameter_operand`); two activations with the same layout union their spaces."""
        operands = [a for a in node.args[:2] if isinstance(a, torch.fx.Node)]
        raw = [self.vals.get(a) for a in operands]
        if len(raw) == 2 and sum(isinstance(v, _Attr) for v in raw) == 1 and sum(isinstance(v, _Val) for v in raw) == 1:
            (x_node, x), (p_node, p) = sorted(zip(operands, raw, strict=False), key=lambda av: isinstance(av[1], _Attr))
            return self.parameter_operand(node, x_node, x, p_node, p)
        pairs = [(a, v) for a, v in ((a, self.value(a)) for a in operands) if v is not None]
        if not pairs:
            return self.frozen_val(node)
        if len(pairs) == 1:
            a_node, v = pairs[0]
            if _shape(node) != _shape(a_node):
                return self.unsupported(node, "broadcasting against a non-tensor changes the shape")
            return v
        return self.binary_values(node, *pairs)

    def binary_values(self, node: torch.fx.Node, first: tuple, second: tuple) -> _Val | None:
        """:meth:`binary` of two traced activations ``(node, value)``."""
        (_, a), (_, b) = first, second
        if self.all_frozen(a) and self.all_frozen(b):
            return self.frozen_val(node)
        passed = self.broadcast_constant(node, first, second)
        if passed is not None:
            return passed
        if not _same_layout(a, b) and a.width == b.width and (a.ndim, a.dim, a.outer) == (b.ndim, b.dim, b.outer) and (
                a.outer is None):  # different cuts of one axis (GhostNet: [primary, cheap] + shortcut): refine both
            cuts = {off for v in (a, b) for _, off in _offsets(v)} | {a.width}
            a, b = self.refine(a, cuts) or a, self.refine(b, cuts) or b
        if not _same_layout(a, b):
            return self.unsupported(node, "operands carry symmetry layouts that do not refine to one")
        self.union_segs(a, b, node)
        return a

    def refine(self, x: _Val, cuts: set[int]) -> _Val | None:
        """``x`` with every segment split at the positions ``cuts`` that fall inside it (its space split into
        consecutive parts, :meth:`split_at`); None if a cut falls inside a unit or a space is split differently."""
        segs: list[_Seg] = []
        for s, off in _offsets(x):
            inner = sorted(c for c in cuts if off < c < off + s.n * s.block)
            if any((c - off) % s.block for c in inner):
                return None
            bounds = [0, *((c - off) // s.block for c in inner), s.n]
            parts = self.split_at(s.space, [e - b for b, e in zip(bounds, bounds[1:], strict=False)])
            if parts is None:
                return None
            segs += [_Seg(p, e - b, s.block) for p, b, e in zip(parts, bounds, bounds[1:], strict=False)]
        return replace(x, segs=tuple(segs))

    def broadcast_constant(self, node: torch.fx.Node, first: tuple, second: tuple) -> _Val | None:
        """The permuted operand when the other one is unpermuted and constant along its permuted dim (a scalar,
        a per-token mask: it broadcasts), else None."""
        for (x_node, x), (c_node, c) in ((first, second), (second, first)):
            if self.all_frozen(c) and not self.all_frozen(x) and _shape(x_node) == _shape(node) and _constant_along(
                _shape(node), _shape(c_node), x.dim
            ):
                return x
        return None

    def union_segs(self, a: _Val, b: _Val, node: torch.fx.Node) -> None:
        """Union the spaces of ``a`` and ``b`` segment by segment (same layout)."""
        for sa, sb in zip(a.segs, b.segs, strict=False):
            self.union(sa.space, sb.space, node)

    def parameter_operand(self, node: torch.fx.Node, x_node, x: _Val, p_node, p: _Attr) -> _Val | None:
        """``x ∘ p`` for activations ``x`` and a parameter/buffer ``p`` (a positional embedding added to tokens,
        a per-feature scale): ``p``'s axis that broadcasts against ``x.dim`` is bound to x's spaces on the
        output side, like a bias; a ``p`` constant along that axis needs no binding."""
        out_shape = _shape(node)
        if out_shape is None or _shape(x_node) != out_shape:
            return self.unsupported(node, f"{p_node.name} broadcasts the activations to a larger shape")
        if _constant_along(out_shape, p.shape, x.dim):
            return x
        axis = p.stored_axis(x.dim - (len(out_shape) - len(p.shape)))
        if p.key is None:  # a tensor outside the state dict cannot move with x
            self.freeze(x)
            return x
        if x.outer is not None:
            if not self.all_frozen(x):
                return self.unsupported(node, f"parameter {p.key!r} would need a different permutation per index of axis {x.outer}")
            self.freeze(p)
            return x
        prev = self.attr_bound.get(p.key)
        if prev is None:
            self.attr_bound[p.key] = (axis, x)
            self.bind(p.key, axis, x, "out")
        elif prev[0] != axis or not _same_layout(prev[1], replace(x, ndim=prev[1].ndim, dim=prev[1].dim)):
            return self.unsupported(node, f"parameter {p.key!r} is combined with activations of different layouts")
        else:
            self.union_segs(prev[1], x, node)
        return x

    def matmul(self, node: torch.fx.Node) -> _Val | None:
        """``a @ b`` (matmul / bmm; batch dims broadcast). A permuted dim contracted on both sides with the same
        spaces (``q @ kᵀ`` per head) unions them and leaves an invariant result; a permuted dim of one operand
        that is not contracted (rows of a, columns of b, per-head spaces on a batch axis) carries over when the
        other operand is not permuted (``attn @ v``), and so does a batch axis both permute with the same spaces.
        Everything else mixes along a permuted dim: unsupported."""
        operands = list(node.args[:2])
        a, b = (self.value(o) for o in operands)
        out_shape = _shape(node)
        if a is None or b is None or out_shape is None:
            return self.unsupported(node, "matmul of non-tensor operands")
        nd = len(out_shape)
        # frozen or size-1 spaces (e.g. a Linear(D, 1) attention-pooling score): only the identity acts on them
        live_a, live_b = not self.inactive(a), not self.inactive(b)
        if not (live_a or live_b):
            return self.frozen_val(node)
        if a.ndim < 2 or b.ndim < 2:
            return self.unsupported(node, "matrix-vector product with a permuted operand")
        con_a, con_b = live_a and a.dim == a.ndim - 1, live_b and b.dim == b.ndim - 2
        if con_a or con_b:
            if not (con_a and con_b and self.contractible(a, b, nd)):
                return self.unsupported(node, "contracts a permuted dim with one that does not carry the same spaces")
            self.union_segs(a, b, node)
            return self.frozen_val(node)  # (a P)(Pᵀ b) = a b
        if live_a and live_b:
            return self.matmul_joint_batch(node, a, b, nd)
        if live_a:
            return self.matmul_one_sided(node, a, operands[1], a.ndim - 1, nd)
        return self.matmul_one_sided(node, b, operands[0], b.ndim - 2, nd)

    def matmul_joint_batch(self, node: torch.fx.Node, a: _Val, b: _Val, nd: int) -> _Val | None:
        """Both operands permuted on the same batch axis (heads of width 1): permuted jointly."""
        if a.dim < a.ndim - 2 and b.dim < b.ndim - 2 and a.dim + nd - a.ndim == b.dim + nd - b.ndim and _same_layout(
            replace(a, ndim=nd, dim=0), replace(b, ndim=nd, dim=0)
        ):
            self.union_segs(a, b, node)
            return a.remap(lambda d: d + nd - a.ndim, nd)
        return self.unsupported(node, "both operands carry permuted dims: the product would carry two")

    def matmul_one_sided(self, node: torch.fx.Node, v: _Val, o_node: Any, contracted: int, nd: int) -> _Val | None:
        """Only ``v`` is permuted, on a dim that is not contracted (``contracted``: its contracted axis); the other
        operand ``o_node`` is not permuted."""
        shift = nd - v.ndim
        if v.outer == contracted:
            return self.unsupported(node, "sums over the axis indexing per-head spaces")
        if v.dim < v.ndim - 2:  # permuting a batch axis: the other operand must not vary along it
            o_shape = _shape(o_node) or ()
            o_axis = v.dim + shift - (nd - len(o_shape))
            if 0 <= o_axis < len(o_shape) - 2 and o_shape[o_axis] != 1:
                return self.unsupported(node, "permutes a batch axis the other operand varies along")
        return v.remap(lambda d: d + shift, nd)

    def contractible(self, a: _Val, b: _Val, nd: int) -> bool:
        """Whether a's last dim and b's second-to-last carry the same layout (per head on one batch axis)."""
        if len(a.segs) != len(b.segs) or any((sa.n, sa.block) != (sb.n, sb.block) for sa, sb in zip(a.segs, b.segs, strict=False)):
            return False
        if a.outer is None or b.outer is None:
            return a.outer is None and b.outer is None
        return a.outer < a.ndim - 2 and b.outer < b.ndim - 2 and a.outer + nd - a.ndim == b.outer + nd - b.ndim

    def reshape(self, node: torch.fx.Node, x: _Val | None) -> _Val | None:
        """flatten / view / reshape / unflatten that merges adjacent dims or splits one dim."""
        if x is None:
            return self.frozen_val(node)
        in_shape, out_shape = _shape(node.args[0]), _shape(node)
        if in_shape is None or out_shape is None:
            return self.unsupported(node, "shape unknown")
        if in_shape == out_shape:
            return x
        new = self.merge_or_split(x, in_shape, out_shape)
        if isinstance(new, str) and x.dim is not None and 1 not in (in_shape[x.dim], *(in_shape[d] for d in (x.outer,) if d is not None)):
            new = self.compact_reshape(x, in_shape, out_shape) or _kept_dim(x, in_shape, out_shape) or new
        if isinstance(new, (_Val, _Parts)):
            return new
        if self.all_frozen(x):
            return self.frozen_val(node)
        return self.unsupported(node, new)

    def merge_or_split(self, x: _Val, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> _Val | _Parts | str:
        merged, split = _merged_range(in_shape, out_shape), _merged_range(out_shape, in_shape)
        if merged is not None:
            return self.merge_dims(x, in_shape, *merged)
        if split is not None:
            return self.split_dim(x, out_shape, *split)
        return f"reshape {in_shape} → {out_shape} neither merges adjacent dims nor splits one"

    def compact_reshape(self, x: _Val, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> _Val | _Parts | None:
        """A reshape that also adds or drops size-1 dims (ResNeSt's ``(B, C, 1, 1) → (B, 1, radix, C / radix)``):
        the merge or split of the dims of size > 1, placed back among the size-1 dims; None if it is neither."""
        keep_in = [i for i, n in enumerate(in_shape) if n != 1]
        keep_out = [i for i, n in enumerate(out_shape) if n != 1]
        compact_in, compact_out = tuple(in_shape[i] for i in keep_in), tuple(out_shape[i] for i in keep_out)
        if compact_in == compact_out:
            new: Any = x.remap(lambda d: keep_in.index(d), len(keep_in))
        else:
            new = self.merge_or_split(x.remap(lambda d: keep_in.index(d), len(keep_in)), compact_in, compact_out)
        if isinstance(new, str):
            return None
        return new.remap(lambda d: keep_out[d], len(out_shape))

    def merge_dims(self, x: _Val, in_shape: tuple[int, ...], s: int, e: int) -> _Val | str:
        """Dims ``s..e`` of ``in_shape`` merged into one; a string says why the symmetry cannot follow."""
        nd = len(in_shape) - (e - s)

        def inside(d: int | None) -> bool:
            return d is not None and s <= d <= e

        if not inside(x.dim):
            if inside(x.outer):
                return "flatten merges the axis indexing per-head spaces with other dims"
            return x.remap(lambda d: d if d < s else d - (e - s), nd)
        if x.outer is not None:  # merging heads back: (…, heads, head_dim) → (…, heads·head_dim)
            if (x.outer, x.dim) == (s, e) and e == s + 1 and all(g.n * g.block == in_shape[e] for g in x.segs):
                return _Val(s, nd, x.segs)
            return "flatten merges per-head spaces in an order other than (head, feature)"
        # earlier dims merged in repeat the layout (timm's patch merging: (…, 2, 2, C) → 4C, every copy moves alike)
        before, inner = math.prod(in_shape[s : x.dim]), math.prod(in_shape[x.dim + 1 : e + 1])
        return _Val(s, nd, tuple(_Seg(g.space, g.n, g.block * inner) for g in x.segs) * before)

    def split_dim(self, x: _Val, out_shape: tuple[int, ...], s: int, e: int) -> _Val | str:
        """Dim ``s`` split into dims ``s..e`` of ``out_shape``; splitting the permuted dim into (groups, width)
        splits its spaces into per-group children (see the module docstring)."""
        nd = len(out_shape)
        moved = x.remap(lambda d: d if d <= s else d + (e - s), nd)
        if x.outer == s:
            return "reshape splits the axis indexing per-head spaces"
        if x.dim != s:
            return moved
        big = [s + i for i, n in enumerate(out_shape[s : e + 1]) if n != 1]
        if len(big) <= 1:  # only singleton dims appear around the permuted one
            return replace(moved, dim=big[0] if big else s)
        if len(big) == 3 and x.outer is None:
            return self.split_parts(x, out_shape, big)
        if len(big) > 2 or x.outer is not None:
            return "reshape splits the permuted dim into more than (parts, groups, width)"
        outer, dim = big
        width = out_shape[dim]
        heads: list[_Seg] = []
        for g, off in _offsets(x):
            if g.block != 1 or off % width or g.n % width:
                return f"splitting the permuted dim into groups of {width} cuts through a space"
            parts = self.split(g.space, g.n // width)
            if parts is None:
                return "the permuted dim is already split into groups of another width"
            heads.extend(_Seg(c, width) for c in parts)
        return _Val(dim, nd, tuple(heads), outer)

    def split_parts(self, x: _Val, out_shape: tuple[int, ...], big: list[int]) -> _Parts | str:
        """The permuted dim split into (parts, heads, head_dim): a fused q/k/v projection (timm's ViT
        ``qkv(x).reshape(B, N, 3, heads, head_dim)``). Its space is split into the parts (q, k, v: never exchanged),
        each part into per-head children; q's and k's heads are joined later where ``q kᵀ`` contracts them."""
        axis, outer, dim = big
        if len(x.segs) != 1 or x.segs[0].block != 1:
            return "a fused q/k/v split of a concatenated or flattened value"
        parts = self.split(x.segs[0].space, out_shape[axis])
        if parts is None:
            return "the permuted dim is already split differently"
        vals = []
        for p in parts:
            heads = self.split(p, out_shape[outer])
            if heads is None:
                return "a part of the fused projection is already split differently"
            vals.append(_Val(dim, len(out_shape), tuple(_Seg(h, out_shape[dim]) for h in heads), outer))
        return _Parts(axis, tuple(vals))

    def parts_op(self, node: torch.fx.Node, x: _Parts) -> Any:
        """What keeps a fused q/k/v value (:class:`_Parts`): moving axes, ``unbind`` / ``x[i]`` on its part axis
        (the slices' values), dtype/contiguity methods."""
        t, nd = node.target, _shape_len(node, x.vals[0].ndim)
        if _matches(node, {"permute", "transpose"}, {torch.permute, torch.transpose}):
            probe = self.permute(node, _Val(x.axis, nd, ()))
            moved = [self.permute(node, v) for v in x.vals]
            return _Parts(probe.dim, tuple(moved))
        if _matches(node, {"unbind"}, {torch.unbind}):
            dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0) % (x.vals[0].ndim)
            if dim == x.axis:
                return tuple(x.take(i) for i in range(len(x.vals)))
        if t is operator.getitem:
            idx = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
            if len(idx) > x.axis and isinstance(idx[x.axis], int) and all(i == slice(None) for i in idx[: x.axis]) and all(
                i == slice(None) for i in idx[x.axis + 1 :]
            ):
                return x.take(idx[x.axis])
        if _matches(node, _ELEMENTWISE_METHODS, set()):
            return x
        return self.unsupported(node, "takes a fused q/k/v value apart other than along its part axis")

    def pad(self, node: torch.fx.Node, x: _Val | None) -> _Val | None:
        """``F.pad(x, pad, …)`` of dims the symmetry does not act on (spatial padding, Swin's window padding): the padded
        entries are one constant along the permuted dim."""
        pad = node.args[1] if len(node.args) > 1 else node.kwargs.get("pad", ())
        nd = x.ndim if x is not None else 0
        return self.other_dims(node, x, {nd - 1 - i for i in range(len(pad) // 2) if pad[2 * i] or pad[2 * i + 1]}, "pads")

    def roll(self, node: torch.fx.Node, x: _Val | None) -> _Val | None:
        """``torch.roll(x, shifts, dims)`` along dims the symmetry does not act on (Swin's cyclic window shift); a roll of
        the flattened tensor (no ``dims``) moves every dim."""
        dims = node.kwargs.get("dims", node.args[2] if len(node.args) > 2 else None)
        dims = (dims,) if isinstance(dims, int) else dims or ()
        nd = x.ndim if x is not None else 0
        return self.other_dims(node, x, {d % nd for d in dims} if dims else set(range(nd)), "rolls")

    def other_dims(self, node: torch.fx.Node, x: _Val | None, touched: set[int], verb: str) -> _Val | None:
        """``x`` unchanged by an op that acts on its dims ``touched`` only, unless they include the permuted dim or the
        per-head axis (then unsupported)."""
        if x is None or self.all_frozen(x):
            return self.frozen_val(node)
        if touched & {x.dim, x.outer}:
            return self.unsupported(node, f"{verb} the permuted dim")
        return x

    def power(self, node: torch.fx.Node) -> _Val | None:
        """``x ** c`` with a number ``c`` (StarReLU's ``relu(x) ** 2``): elementwise."""
        base, exponent = (node.args + (None,))[:2]
        if isinstance(exponent, torch.fx.Node) or not isinstance(base, torch.fx.Node):
            return self.unsupported(node, "a power with a tensor exponent or a number base")
        return self.elementwise(node, self.value(base))

    def expand(self, node: torch.fx.Node, x: _Val | None) -> _Val | None:
        """``x.expand(…)``: broadcasting size-1 dims; the permuted dim (and a per-head axis) must keep its size."""
        in_shape, out_shape = _shape(node.args[0]), _shape(node)
        if in_shape is None or out_shape is None or len(in_shape) != len(out_shape):
            return self.unsupported(node, "expand that adds dims") if x is not None and not self.all_frozen(x) else (
                self.frozen_val(node))
        return self.other_dims(node, x, {d for d, (a, b) in enumerate(zip(in_shape, out_shape, strict=True)) if a != b},
                               "broadcasts")

    def chunk(self, node: torch.fx.Node, x: _Val | None) -> tuple | None:
        """``x.chunk(k, dim)``: along a dim the symmetry does not act on, every chunk carries x's spaces; along the
        permuted dim, x's space is split into ``k`` equal parts, one per chunk (a fused projection split into q, k,
        v; ShuffleNet's two branches)."""
        k = node.kwargs.get("chunks", node.args[1] if len(node.args) > 1 else None)
        dim = node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else 0)
        shape = _shape(node.args[0])
        if shape is None or not isinstance(k, int):
            return self.unsupported(node, "chunk of a value of unknown shape")
        step = -(-shape[dim] // k)
        return self.pieces(node, x, [min(step, shape[dim] - i) for i in range(0, shape[dim], step)], dim)

    def split_sizes(self, node: torch.fx.Node, x: _Val | None) -> tuple | None:
        """``torch.split(x, size or sizes, dim)`` (Res2Net's scales): as :meth:`chunk`."""
        size = node.kwargs.get("split_size_or_sections", node.kwargs.get("split_size", node.args[1] if len(node.args) > 1 else None))
        dim = node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else 0)
        shape = _shape(node.args[0])
        if shape is None or not isinstance(size, (int, list, tuple)):
            return self.unsupported(node, "split of a value of unknown shape")
        sizes = list(size) if not isinstance(size, int) else [min(size, shape[dim] - i) for i in range(0, shape[dim], size)]
        return self.pieces(node, x, sizes, dim)

    def pieces(self, node: torch.fx.Node, x: _Val | None, sizes: list[int], dim: int) -> tuple | None:
        """Pieces of ``x`` of ``sizes`` along ``dim``; on the permuted dim its spaces are split at the pieces' ends."""
        if x is None:
            return None
        dim %= x.ndim
        if self.all_frozen(x):
            return tuple(x if dim != x.dim else _Val(dim, x.ndim, (_Seg(self.new_space(n, node.name, True), n),)) for n in sizes)
        if dim != x.dim:
            if dim == x.outer:
                return self.unsupported(node, "splits the axis indexing per-head spaces")
            return tuple(x for _ in sizes)
        ends = [sum(sizes[: i + 1]) for i in range(len(sizes))]
        refined = self.refine(x, {0, *ends})
        pieces = [_whole_segments(refined, slice(a, b)) if refined else None for a, b in zip([0, *ends], ends, strict=False)]
        if any(p is None for p in pieces):
            return self.unsupported(node, "splits the permuted dim through a unit, or a space already split differently")
        return tuple(replace(x, segs=p) for p in pieces)

    def reduce(self, node: torch.fx.Node, x: _Val | None) -> _Val | None:
        if x is None:
            return self.frozen_val(node)
        dims = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
        keepdim = node.kwargs.get("keepdim", node.args[2] if len(node.args) > 2 else False)
        if dims is None:
            return self.frozen_val(node)  # full reduction: a scalar, invariant under every permutation
        dims = {d % x.ndim for d in (dims if isinstance(dims, (tuple, list)) else (dims,))}
        if x.dim in dims:
            return self.frozen_val(node)  # sum/mean over units is permutation-invariant
        nd = _shape_len(node, x.ndim)
        if x.outer in dims and not self.all_frozen(x):  # summing the heads (ResNeSt's radix): one permutation for all
            if not self.join_heads(node, x):
                return self.unsupported(node, "reduces over the axis indexing per-head spaces of different layouts")
            return _Val(x.dim if keepdim else x.dim - sum(r < x.dim for r in dims), nd, x.segs[:1])
        return x.remap(lambda d: d if keepdim else d - sum(r < d for r in dims), nd)

    def join_heads(self, node: torch.fx.Node, x: _Val) -> bool:
        """Union the spaces of every index of ``x.outer`` (an op mixing values across it needs one permutation for all);
        False if their layouts differ."""
        if any((s.n, s.block) != (x.segs[0].n, x.segs[0].block) for s in x.segs):
            return False
        for seg in x.segs[1:]:
            self.union(x.segs[0].space, seg.space, node)
        return True

    def softmax(self, node: torch.fx.Node, x: _Val | None) -> _Val | None:
        """softmax / log_softmax commute with permutations of every dim, their own included; over the axis indexing
        per-head spaces (ResNeSt's radix softmax) they mix the heads, which then need one permutation."""
        return self.softmax_over(node, x, node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None))

    def softmax_over(self, node: torch.fx.Node, x: _Val | None, dim: int | None) -> _Val | None:
        if x is not None and x.outer is not None and dim is not None and dim % x.ndim == x.outer and not (
                self.join_heads(node, x)):
            return self.unsupported(node, "softmax across per-head spaces of different layouts")
        return self.elementwise(node, x)

    def permute(self, node: torch.fx.Node, x: _Val | None) -> _Val | None:
        if x is None:
            return self.frozen_val(node)
        if node.target in ("transpose", torch.transpose):
            a, b = (d % x.ndim for d in node.args[1:3])
            return x.remap(lambda d: b if d == a else a if d == b else d, x.ndim)
        order = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (tuple, list)) else node.args[1:]
        order = [d % x.ndim for d in order]
        return x.remap(order.index, x.ndim)

    def cat(self, node: torch.fx.Node) -> _Val | None:
        parts = node.args[0]
        dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0)
        attrs = [p for p in parts if isinstance(self.vals.get(p), _Attr) and self.vals[p].key is not None]
        # a class token prepended to the patches: bound like a bias
        if attrs and any(not isinstance(self.vals.get(p), _Attr) for p in parts):
            return self.cat_parameters(node, parts, dim)
        if all(isinstance(self.vals.get(p), _Attr) and len(self.vals[p].shape) == 1 for p in parts):
            return _AttrCat(tuple((self.vals[p], self.vals[p].shape[0], self.constant_tensor(p)) for p in parts))
        vals = [self.value(p) for p in parts]
        if any(v is None for v in vals):
            return self.unsupported(node, "concatenation of non-tensor values")
        ndim = vals[0].ndim
        dim %= ndim
        if any(v.dim != vals[0].dim for v in vals):
            return self.unsupported(node, "concatenated tensors carry their symmetry on different dims")
        if any(v.outer is not None and not self.all_frozen(v) for v in vals):
            return self.unsupported(node, "concatenation of values with per-head spaces")
        if dim == vals[0].dim:
            return _Val(dim, ndim, tuple(s for v in vals for s in v.segs))
        for v in vals[1:]:
            self.union_segs(vals[0], v, node)
        return vals[0]

    def constant_tensor(self, node: torch.fx.Node) -> bool:
        """Whether the tensor a ``get_attr`` node reads has one value throughout (a zero bias buffer)."""
        t: Any = self.gm
        for part in str(node.target).split("."):
            t = getattr(t, part, None)
        return torch.is_tensor(t) and t.numel() > 0 and bool((t == t.reshape(-1)[0]).all())

    def functional_linear(self, node: torch.fx.Node) -> _Val | None:
        """``F.linear(x, weight, bias)`` with the model's ``weight`` (BEiT's ``F.linear(x, qkv.weight, qkv_bias)``):
        like a Linear layer; a concatenated bias (:class:`_AttrCat`) splits the output space into its parts, each bound
        to its tensor, and a constant part outside the state dict needs no binding (any other freezes its part)."""
        args = dict(zip(("input", "weight", "bias"), node.args, strict=False)) | dict(node.kwargs)
        x, w = self.value(args["input"]), self.vals.get(args["weight"]) if isinstance(args.get("weight"), torch.fx.Node) else None
        b = self.vals.get(args.get("bias")) if isinstance(args.get("bias"), torch.fx.Node) else None
        if x is None or not isinstance(w, _Attr) or w.key is None or x.outer is not None or (
                args.get("bias") is not None and not (isinstance(b, _AttrCat) or isinstance(b, _Attr) and b.key is not None)):
            return self.unsupported(node, "linear whose weight or bias is not a parameter of the model, or of per-head values")
        x = self.require_dim(node, x, x.ndim - 1)
        self.bind(w.key, 1, x, "in")
        space = self.module_out_space(w.key.rsplit(".", 1)[0], w.shape[0])
        out = _Val(x.dim, _shape_len(node, x.ndim), (_Seg(space, w.shape[0]),))
        self.bind(w.key, 0, out, "out")
        if isinstance(b, _Attr):
            self.bind(b.key, 0, out, "out")
        elif isinstance(b, _AttrCat):
            children = self.split_at(space, [n for _, n, _ in b.parts])
            if children is None:
                return self.unsupported(node, "a concatenated bias whose parts cut the output space differently")
            for (a, _, constant), child in zip(b.parts, children, strict=True):
                if a.key is not None:
                    self.bindings.append((a.key, AxisBinding(0, "", "out", 1, 0, False), child))
                elif not constant:
                    self.set_frozen(child)
        return out

    def cat_parameters(self, node: torch.fx.Node, parts: list, dim: int) -> _Val | None:
        """``cat([token, x], dim)`` along a dim the symmetry does not act on, ``token`` a parameter (a ViT's class
        token, expanded over the batch): its axis along the permuted dim is bound to x's spaces, output side."""
        acts = [self.value(p) for p in parts if not isinstance(self.vals.get(p), _Attr)]
        if any(v is None for v in acts):
            return self.unsupported(node, "concatenation of non-tensor values")
        x = acts[0]
        for v in acts[1:]:
            if v.dim != x.dim:
                return self.unsupported(node, "concatenated tensors carry their symmetry on different dims")
            self.union_segs(x, v, node)
        if dim % x.ndim == x.dim or x.outer is not None:
            return self.unsupported(node, "a parameter concatenated along the permuted dim (or with per-head spaces)")
        for p in parts:
            a = self.vals.get(p)
            if isinstance(a, _Attr):
                axis = x.dim - (x.ndim - len(a.shape))
                if axis < 0 or a.shape[axis] != x.width:
                    return self.unsupported(node, f"parameter {a.key!r} of shape {a.shape} does not span the permuted dim")
                prev = self.attr_bound.get(a.key)
                if prev is None:
                    self.attr_bound[a.key] = (a.stored_axis(axis), x)
                    self.bind(a.key, a.stored_axis(axis), x, "out")
                else:
                    self.union_segs(prev[1], x, node)
        return x

    def index(self, node: torch.fx.Node) -> _Val | None:
        """``x[idx]`` with ints / full slices / ``None`` (e.g. a ViT's class token ``x[:, 0]``): allowed when the
        permuted dim is taken whole; the dims removed or inserted before it shift it."""
        x = self.value(node.args[0])
        idx = node.args[1] if isinstance(node.args[1], tuple) else (node.args[1],)
        if x is None or self.all_frozen(x):  # e.g. a relative-position bias gathered from its table
            return self.frozen_val(node)
        if x.outer is not None or any(i is Ellipsis or not isinstance(i, (int, slice, type(None))) for i in idx):
            return self.unsupported(node, "indexing with tensors, Ellipsis or a value with per-head spaces")
        out_dim, axis, segs = x.dim, 0, x.segs
        for i in idx:
            if i is None:
                out_dim += 1
                continue
            if axis == x.dim and not (isinstance(i, slice) and i == slice(None)):
                segs = self.index_slice(x, i) if isinstance(i, slice) else None
                if segs is None:
                    return self.unsupported(node, "indexing into the permuted dim other than a range of whole spaces")
            if axis < x.dim and isinstance(i, int):
                out_dim -= 1
            axis += 1
        return _Val(out_dim, _shape_len(node, x.ndim), segs)

    def index_slice(self, x: _Val, i: slice) -> tuple[_Seg, ...] | None:
        """The segments of a contiguous slice of the permuted dim: whole spaces, or parts of spaces split at the slice's
        ends (DPN's ``x[:, :n]`` and ``x[:, n:]`` of one convolution's output; permutations within each part); None if
        it has a step, cuts through a unit or a space is already split differently."""
        start, stop, step = i.indices(x.width)
        refined = self.refine(x, {start, stop}) if x.outer is None and step == 1 else None
        return _whole_segments(refined, i) if refined is not None else None

    def attention_function(self, node: torch.fx.Node) -> _Val | None:
        """``F.scaled_dot_product_attention(q, k, v)``: like ``softmax(q kᵀ) v`` — q's and k's spaces joined per
        head (the scores are invariant), the output carries v's."""
        q, k, v = (self.value(a) for a in node.args[:3])
        if q is None or k is None or v is None:
            return self.unsupported(node, "attention of non-tensor operands")
        if self.inactive(q) and self.inactive(k):
            return v
        if not (q.dim == q.ndim - 1 and k.dim == k.ndim - 1 and _same_layout(q, k)):
            return self.unsupported(node, "query and key carry their symmetry on different dims or layouts")
        self.union_segs(q, k, node)
        return v

    # ---------------------------------------------------------------- result
    def build_spec(self, model: nn.Module) -> SymmetrySpec:
        for key, (_, val) in self.attr_bound.items():
            if key in self.attr_frozen:  # also read where it cannot be permuted
                if self.on_unsupported == "error" and not self.inactive(val):
                    raise UnsupportedOperationError(
                        f"parameter {key!r} moves with a permuted space where it is combined with activations, but is "
                        "also read where it cannot move (an operation without a symmetry rule on it); freezing would "
                        "leave that space unpermuted. Pass on_unsupported='freeze' to accept that, or register_rule")
                self.freeze(val)
        roots = {}
        for i in range(len(self.parent)):
            r = self.find(i)
            if not self.frozen[r] and r not in self.children and r not in roots:
                roots[r] = f"P_{self.creator[r]}"
        sd = model.state_dict()
        tensors: dict[str, list[AxisBinding]] = {k: [] for k in sd}
        for key, b, sid in self.bindings:
            leaves = self.leaves(sid, b.block, b.offset)
            for r, off in leaves:
                if r in roots:
                    if key not in tensors:
                        raise TraceError(f"traced binding for {key!r}, which is not in the model's state dict")
                    tensors[key].append(replace(b, space=roots[r], offset=off, partial=b.partial or len(leaves) > 1))
        spaces = {name: Space(name, self.size[r]) for r, name in roots.items()}
        probes: dict[str, list[Probe]] = {name: [] for name in spaces}
        self.add_probes(probes, roots, self.probes, set(spaces))
        # writer outputs only where no writer reads the space (q/k heads: QKᵀ is their only reader)
        self.add_probes(probes, roots, self.out_probes, {s for s, p in probes.items() if not p})
        return SymmetrySpec(
            spaces=spaces,
            tensors={k: tuple(v) for k, v in tensors.items()},
            shapes={k: tuple(t.shape) for k, t in sd.items()},
            probes={k: tuple(v) for k, v in probes.items()},
            repair_points=tuple(self.repair_points(roots)),
            buffers=frozenset(k for k, _ in model.named_buffers() if k in sd),
        )

    def add_probes(
        self, probes: dict[str, list[Probe]], roots: dict[int, str], found: list[tuple[int, Probe]], wanted: set[str]
    ) -> None:
        for sid, p in found:
            for r, off in self.leaves(sid, p.block, p.offset):
                if r in roots and roots[r] in wanted:
                    probes[roots[r]].append(replace(p, offset=off))

    def repair_points(self, roots: dict[int, str]) -> list[tuple]:
        """Where REPAIR corrects statistics: each hidden writer, or the affine norm layers right after it — also when
        they read it through concatenations and pooling (DenseNet: a bias-free conv whose channels every later
        layer's norm reads), where the norms' outputs are corrected instead (each once)."""
        points: list[tuple[str, int]] = []
        for name, sid, node in self.writers:
            if self.find(sid) not in roots:
                continue
            norms = self._norms_behind(node)
            for point in norms or [(name, self.vals[node].dim)]:
                if point not in points:
                    points.append(point)
        return points

    def _norms_behind(self, node: torch.fx.Node, depth: int = 0) -> list[tuple[str, int]] | None:
        """The affine norm layers (name, channel dim) that every use of ``node`` reaches directly or through
        ``torch.cat`` and pooling only (DenseNet's transitions pool before the next block concatenates); None if some
        use is anything else."""
        found: list[tuple[str, int]] = []
        for u in node.users:
            if u.target is getattr or u.op == "call_method" and u.target in _NON_TENSOR_METHODS:
                continue  # x.ndim, x.size(): shape checks read no values
            mod = self.modules.get(str(u.target)) if u.op == "call_module" else None
            if isinstance(mod, _NORM_MODULES) and getattr(mod, "weight", None) is not None and self.vals.get(u) is not None:
                found.append((str(u.target), self.vals[u].dim))
            elif u.op == "call_function" and u.target in _FUNCTIONAL_NORM_WEIGHT:
                point = self._functional_norm_point(u)
                if point is None:
                    return None
                found.append(point)
            elif depth < 256 and (u.op == "call_function" and u.target in (torch.cat, torch.concat, *_POOL_FUNCTIONS)
                                  or isinstance(mod, _POOL_MODULES)):
                sub = self._norms_behind(u, depth + 1)
                if sub is None:
                    return None
                found += sub
            else:
                return None
        return found or None

    def _functional_norm_point(self, u: torch.fx.Node) -> tuple[str, int, str] | None:
        """A norm computed by ``F.batch_norm`` / ``F.layer_norm`` inside a module whose forward adds an activation
        (timm's ``BatchNormAct2d``): ``(module owning the affine, channel dim, the elementwise module reading the
        norm's output)`` — REPAIR corrects that module's *input* (before the activation) and folds into the affine."""
        index, name = _FUNCTIONAL_NORM_WEIGHT[u.target]
        arg = u.kwargs.get(name, u.args[index] if len(u.args) > index else None)
        a = self.vals.get(arg) if isinstance(arg, torch.fx.Node) else None
        if not isinstance(a, _Attr) or a.key is None or self.vals.get(u) is None or len(u.users) != 1:
            return None
        owner = a.key.rsplit(".", 1)[0]
        (reader,) = u.users
        mod = self.modules.get(str(reader.target)) if reader.op == "call_module" else None
        if not isinstance(mod, _ELEMENTWISE_MODULES) or getattr(self.modules.get(owner), "bias", None) is None:
            return None
        return owner, self.vals[u].dim, str(reader.target)


_FUNCTIONAL_NORM_WEIGHT = {F.batch_norm: (3, "weight"), F.layer_norm: (2, "weight")}
"""Functional norms: the position and name of their affine ``weight`` argument."""


def symmetry_spec(
    model: nn.Module,
    example_input: torch.Tensor | tuple[torch.Tensor, ...] | None = None,
    *,
    on_unsupported: OnUnsupported = "error",
    leaf_modules: tuple[type[nn.Module], ...] = (),
    check: bool = True,
) -> SymmetrySpec:
    """Trace ``model`` with torch.fx and derive its permutation symmetries.

    A Hugging Face ``transformers.PreTrainedModel`` (or a module wrapping exactly one) is not traced: its
    family adapter gives the spec (:func:`modeconn.symmetry.hf.hf_symmetry_spec`; ``example_input`` and the
    tracing options are ignored).

    Args:
        model: any nn.Module built from the supported layers (see module docstring). Not modified: its
            train/eval flags are restored and shape propagation runs under ``no_grad`` in eval mode, on
            :func:`~modeconn.symmetry.selfcheck.check_examples` of ``example_input`` (its first rows when it is one
            batch).
        example_input: a tensor (or tuple of tensors) of the shape the model takes, e.g. (N, C, H, W);
            required unless ``model`` is a Hugging Face model.
        on_unsupported: ``"error"`` (default) raises :class:`UnsupportedOperationError` naming the node and the
            module whose forward holds it; ``"freeze"`` leaves every space touching such a node unpermuted.
        check: verify the traced spec on a perturbed copy before returning it
            (:func:`modeconn.symmetry.selfcheck.check_function_preserved`: random norm affines, BN statistics and
            biases, a random group element, outputs compared on ``example_input`` and on a larger copy of it, in eval
            and train mode; what it can and cannot prove is in that module's docstring). ``False`` skips it.
    Returns: a validated :class:`SymmetrySpec` (every state-dict tensor listed exactly once; input and
        output spaces never permuted) that keeps the model's function.
    Raises: :class:`ConfigError` for a bad option, :class:`TraceError` if fx cannot trace the model,
        :class:`SpecError` if the traced spec changes the function of the perturbed copy (naming the spaces and the
        tensors that do not follow them), if a forward keeps changing the model's Python state, or if a subclass of a
        stock layer with its own ``forward`` cannot be traced into and is not registered (naming its path and class).
    """
    from .hf.registry import find_hf_model, hf_symmetry_spec  # lazy: never imports transformers itself

    if find_hf_model(model) is not None:
        return hf_symmetry_spec(model)
    if example_input is None:
        raise ConfigError(f"symmetry_spec({type(model).__name__}) needs an example_input to trace the model")
    if on_unsupported not in ("error", "freeze"):
        raise ConfigError(f"on_unsupported must be 'error' or 'freeze', got {on_unsupported!r}")
    inputs = example_input if isinstance(example_input, tuple) else (example_input,)
    _register_known_rules()
    # the self-check's perturbed state: shape propagation runs with it, so its outputs are the check's reference
    state = perturbed_state(model, torch.Generator().manual_seed(0)) if check else None
    with eval_mode(model):  # traced in eval mode: train-only branches (BatchNorm counters, dropout paths) stay out
        gm = _fx_trace(model, leaf_modules, trust_layer_subclasses=False)
        try:
            with torch.no_grad():  # shapes need no more than the examples the self-check runs on
                outputs = propagate_shapes(gm, check_examples(inputs), state)
        except Exception as exc:  # any failure of the example forward is a user-facing trace error
            raise TraceError(f"running {type(model).__name__} on the example input failed: {exc}") from exc
    tracer = _Tracer(gm, on_unsupported, frozenset(model.state_dict()))
    try:
        tracer.run()
        spec = tracer.build_spec(model)
    except UnsupportedOperationError as exc:
        raise UnsupportedOperationError(f"{exc} {_freeze_cost(gm, model)}") from None
    spec.validate(model)
    if state is not None:
        check_function_preserved(spec, model, inputs, reference=(state, outputs))
    return spec


ELEMENTWISE_RULES: set[Any] = set()
"""Functions and module types registered as elementwise (:func:`register_rule`)."""


def register_rule(target: Any, rule: str | type[nn.Module] = "elementwise") -> None:
    """Tell the tracer how a function or module type of your own acts on symmetries.

    Args:
        target: a function (as it appears in the traced graph; for an fx-wrapped function the wrapped one, e.g.
            ``torchvision.ops.stochastic_depth``) or an ``nn.Module`` subclass.
        rule: ``"elementwise"`` — the output is the input transformed alike, channel by channel (activations,
            stochastic depth, dropout-like ops; parameters of such a module stay unbound, so it must have none that
            vary along channels); or a stock layer type (``nn.Linear``, ``nn.Conv2d``, ``nn.LayerNorm`` …) whose rule
            applies to ``target``, a subclass of it whose own ``forward`` keeps that layer's symmetry with the same
            parameters (without registration such a subclass is traced into, and refused with a SpecError where the
            tracer cannot follow it). The self-check still verifies what the rule binds, in eval and train mode.
    Raises: ConfigError for another rule, or a stock-layer rule for a type that does not subclass it.
    """
    if rule == "elementwise":
        ELEMENTWISE_RULES.add(target)
        return
    if isinstance(rule, type) and rule in _RULE_MODULES and isinstance(target, type) and issubclass(target, rule):
        MODULE_RULES[target] = rule
        return
    raise ConfigError(f"register_rule: rule must be 'elementwise' or one of {[m.__name__ for m in _RULE_MODULES]} for an "
                      f"nn.Module subclass; got {rule!r} for {target!r}")


MODULE_RULES: dict[type, type] = {}
"""Module types registered with the rule of a stock layer (:func:`register_rule`)."""
LIBRARY_MODULES: dict[type, type | str] = {}
"""Layer types of libraries with the rule of a stock layer or ``"elementwise"``
(:func:`modeconn.symmetry.trace_library.library_modules`), filled when tracing."""


def _freeze_cost(gm: torch.fx.GraphModule, model: nn.Module) -> str:
    """What ``on_unsupported="freeze"`` would cost: how many of the writers' spaces it leaves unpermuted."""
    tracer = _Tracer(gm, "freeze", frozenset(model.state_dict()))
    try:
        tracer.run()
        spec = tracer.build_spec(model)
    except (UnsupportedOperationError, TraceError, SpecError) as exc:
        return f"(freezing is not possible either: {exc})"
    writers = {name for name, _, _ in tracer.writers}
    live = {b.space for name in writers for b in spec.tensors.get(f"{name}.weight", ()) if b.side == "out"}
    bound = {name for name in writers if any(b.side == "out" for b in spec.tensors.get(f"{name}.weight", ()))}
    return (f"(freezing would leave {len(writers) - len(bound)} of {len(writers)} writer layers' output spaces "
            f"unpermuted; {len(live)} spaces would remain)")


LIBRARY_RULES: dict[Callable, Callable[[_Tracer, torch.fx.Node], Any]] = {}
"""Rules for fx-wrapped functions of libraries (:mod:`modeconn.symmetry.trace_library`), filled when tracing."""


def _register_known_rules() -> None:
    """The rules of :mod:`~modeconn.symmetry.trace_library` for the libraries imported by now."""
    from .trace_library import library_modules, library_rules

    LIBRARY_RULES.update(library_rules())
    LIBRARY_MODULES.update(library_modules())


def _rule_leaf(m: nn.Module) -> bool:
    """Whether ``m`` is one node with the rule of a stock layer: the layer itself, a subclass that keeps its base's
    ``forward``, or a type registered with a rule (:func:`register_rule`, the library layers of
    :func:`~modeconn.symmetry.trace_library.library_modules`). A subclass with a ``forward`` of its own is traced into
    (never trusted to keep its base's symmetry: it may transform its input or output, or act differently in training
    or on large inputs): torchvision's ConvNeXt ``LayerNorm2d`` subclasses ``nn.LayerNorm`` but normalises
    channels-last, timm's ``Linear`` calls ``F.linear``; where the tracer cannot follow it, a SpecError names it
    (:func:`_own_forward_layer`)."""
    if _registered(type(m)) is not None:
        return True
    base = _rule_base(type(m))
    return base is not None and type(m).forward is base.forward


def _layer_leaf(m: nn.Module) -> bool:
    """:func:`_rule_leaf`, and every Linear / Conv / activation subclass one node: where only the data flow between
    layers matters, not their symmetry (LLPF's parameter groups)."""
    base = _rule_base(type(m))
    return (base is not None and base not in _NORM_MODULES) or _rule_leaf(m)


def _rule_base(cls: type) -> type | None:
    """The stock layer of :data:`_RULE_MODULES` that ``cls`` subclasses, if any."""
    return next((b for b in _RULE_MODULES if isinstance(cls, type) and issubclass(cls, b)), None)


def _registered(cls: type) -> type | str | None:
    """The rule ``cls`` is registered with (a stock layer type or ``"elementwise"``), by the user or for a library."""
    if cls in MODULE_RULES:
        return MODULE_RULES[cls]
    if cls in ELEMENTWISE_RULES:
        return "elementwise"
    return LIBRARY_MODULES.get(cls)


def _own_forward_layer(cls: Any) -> type | None:
    """The stock layer ``cls`` subclasses when it overrides its ``forward`` and is not registered (traced into)."""
    base = _rule_base(cls) if isinstance(cls, type) else None
    if base is None or cls.forward is base.forward or _registered(cls) is not None:
        return None
    return base


def _untraceable_layer(path: str, cls: type, base: type, why: str) -> SpecError:
    return SpecError(
        f"module {path!r} ({cls.__name__}) subclasses torch.nn.{base.__name__} with a forward of its own, which the "
        f"tracer cannot follow ({why}); a layer subclass is never trusted to keep its base's symmetry. If its forward "
        f"keeps {base.__name__}'s symmetry, register it: modeconn.symmetry.register_rule({cls.__name__}, "
        f"torch.nn.{base.__name__}) (the self-check then verifies it in eval and train mode, at two input scales); "
        "else write the spec by hand (SymmetrySpec.from_axes)"
    )


def _layer_in_stack(node: torch.fx.Node) -> tuple[str, type, type] | None:
    """``(path, class, stock layer)`` of the outermost unregistered layer subclass with its own forward that holds
    ``node`` (fx's ``nn_module_stack``)."""
    for path, cls in (node.meta.get("nn_module_stack") or {}).values():
        base = _own_forward_layer(cls)
        if base is not None:
            return path, cls, base
    return None


def _fx_trace(model: nn.Module, leaf_modules: tuple[type[nn.Module], ...],
              trust_layer_subclasses: bool = True) -> torch.fx.GraphModule:
    """``model`` traced by torch.fx with the stock layers we have rules for as leaves (:func:`_rule_leaf`, or
    :func:`_layer_leaf` with ``trust_layer_subclasses``; fx alone would trace through any module defined outside
    torch.nn)."""
    class _Tr(torch.fx.Tracer):
        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            leaf = _layer_leaf(m) if trust_layer_subclasses else _rule_leaf(m)
            return isinstance(m, leaf_modules) or leaf or super().is_leaf_module(m, qualname)

    try:
        graph = _Tr().trace(model)
    except Exception as exc:
        if not trust_layer_subclasses:
            _blame_layer_subclass(_Tr, model, exc)
        raise TraceError(
            f"torch.fx could not trace {type(model).__name__}: {exc}. Models with data-dependent control flow "
            "need a hand-written spec (SymmetrySpec.from_axes) or an adapter."
        ) from exc
    return torch.fx.GraphModule(model, graph)


def _blame_layer_subclass(tracer: type[torch.fx.Tracer], model: nn.Module, exc: Exception) -> None:
    """SpecError naming the first unregistered layer subclass with its own forward that fx cannot trace alone, when
    tracing ``model`` failed with ``exc``; nothing when there is none (the failure is elsewhere)."""
    for path, m in model.named_modules():
        base = _own_forward_layer(type(m))
        if base is None:
            continue
        try:
            tracer().trace(m)
        except Exception as inner:  # the layer's own forward is what fx cannot follow
            raise _untraceable_layer(path, type(m), base, f"torch.fx: {inner}") from exc


# -------------------------------------------------------------------- small helpers
def _shape(node: Any) -> tuple[int, ...] | None:
    if not isinstance(node, torch.fx.Node):
        return None
    meta = node.meta.get("tensor_meta")
    shape = getattr(meta, "shape", None)
    return tuple(shape) if shape is not None else None


def _shape_len(node: torch.fx.Node, default: int) -> int:
    shape = _shape(node)
    return len(shape) if shape is not None else default


def _same_layout(a: _Val, b: _Val) -> bool:
    """Whether two values carry their symmetry on the same dim (and head axis) with segments of equal sizes."""
    return (a.ndim, a.dim, a.outer, len(a.segs)) == (b.ndim, b.dim, b.outer, len(b.segs)) and all(
        (sa.n, sa.block) == (sb.n, sb.block) for sa, sb in zip(a.segs, b.segs, strict=False)
    )


def _constant_along(out_shape: tuple[int, ...] | None, shape: tuple[int, ...] | None, dim: int) -> bool:
    """Whether a tensor of ``shape``, broadcast to ``out_shape``, is constant along ``dim`` (missing or size 1)."""
    if out_shape is None or shape is None:
        return False
    axis = dim - (len(out_shape) - len(shape))
    return axis < 0 or shape[axis] == 1


def _merged_range(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> tuple[int, int] | None:
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


def _kept_dim(x: _Val, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> _Val | None:
    """A reshape that only regroups the dims before and after the permuted one, which survives whole (Swin's and MaxViT's
    window partitions ``(B, H, W, C) → (B, H/7, 7, W/7, 7, C)``): x at its new position; None otherwise."""
    if x.outer is not None:
        return None
    before = math.prod(in_shape[: x.dim])
    for k, n in enumerate(out_shape):
        if n == in_shape[x.dim] and math.prod(out_shape[:k]) == before:
            return _Val(k, len(out_shape), x.segs)
    return None


def _whole_segments(x: _Val, i: slice) -> tuple[_Seg, ...] | None:
    """The segments a contiguous slice of the permuted dim takes whole (GhostNet's ``out[:, :n]`` of a concatenation);
    None if it cuts through one or has a step."""
    start, stop, step = i.indices(x.width)
    if step != 1:
        return None
    taken = [(s, off) for s, off in _offsets(x) if off < stop and off + s.n * s.block > start]
    if not taken or taken[0][1] != start or taken[-1][1] + taken[-1][0].n * taken[-1][0].block != stop:
        return None
    return tuple(s for s, _ in taken)


def _offsets(x: _Val):
    off = 0
    for s in x.segs:
        yield s, off
        off += s.n * s.block


def _flat_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    out: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda n: out.append(n) or n)
    return out


def _module_of(node: torch.fx.Node) -> str:
    """`` in module 'path' (Type)``: the innermost module whose forward holds ``node`` (fx's ``nn_module_stack``)."""
    if node.op == "call_module":
        return ""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, cls = list(stack.values())[-1]
    name = getattr(cls, "__name__", str(cls).rsplit(".", 1)[-1].rstrip("'>"))
    return f" in module {path!r} ({name})" if path else f" in {name}.forward"


def _target_name(node: torch.fx.Node) -> str:
    t: Callable | str = node.target
    return t if isinstance(t, str) else getattr(t, "__qualname__", None) or getattr(t, "__name__", repr(t))
