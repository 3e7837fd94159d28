"""Automatic symmetry specs from a torch.fx trace.

One pass over the fx graph in topological order. Every tensor value carries the dimension on which a
symmetry acts (``dim``) and its layout along that dimension: a list of segments, each a union-find
space id with a size and a ``block`` (entries per unit; > 1 after conv → flatten). Writers (Linear,
Conv) create a space per module; readers bind their input axis to the spaces of their input value;
residual additions and other elementwise binary ops *union* the spaces of their operands; the model's
inputs and outputs are *frozen* spaces, and anything unioned with a frozen space is frozen too.
Frozen spaces are dropped at the end: their axes stay unbound (never permuted).

Supported: Linear, Conv1d/2d/3d (groups=1 or depthwise), BatchNorm1d/2d/3d, LayerNorm, GroupNorm
(1 group or one per channel), PReLU, elementwise activations, dropout, pooling, flatten / view /
reshape that merges the trailing dimensions, permute / transpose, mean/sum/amax reductions, residual
additions and products, concatenation. Anything else raises :class:`UnsupportedOperationError` naming
the node, or with ``on_unsupported="freeze"`` freezes every space touching it.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.passes.shape_prop import ShapeProp

from ..errors import ConfigError, TraceError, UnsupportedOperationError
from .spec import AxisBinding, Probe, Space, SymmetrySpec

OnUnsupported = Literal["error", "freeze"]


@dataclass(frozen=True)
class _Seg:
    space: int
    n: int
    block: int = 1


@dataclass(frozen=True)
class _Val:
    """A tensor value: symmetry acts on ``dim``, laid out as ``segs`` along it."""

    dim: int
    ndim: int
    segs: tuple[_Seg, ...]

    @property
    def width(self) -> int:
        return sum(s.n * s.block for s in self.segs)


_ELEMENTWISE_MODULES = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.SELU, nn.CELU,
    nn.Softplus, nn.Mish, nn.Hardswish, nn.Hardtanh, nn.Hardsigmoid, nn.Identity, nn.Dropout, nn.Dropout1d,
    nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.Softsign, nn.Tanhshrink, nn.LogSigmoid,
)
_POOL_MODULES = (
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d,
)
_NORM_MODULES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)
_RULE_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.PReLU, nn.Flatten, nn.Softmax, nn.LogSoftmax,
                 *_NORM_MODULES, *_ELEMENTWISE_MODULES, *_POOL_MODULES)
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
    F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d,
}
_BINARY = {operator.add, operator.sub, operator.mul, operator.truediv, operator.iadd, operator.imul,
           torch.add, torch.sub, torch.mul, torch.div, torch.maximum, torch.minimum}
_BINARY_METHODS = {"add", "add_", "sub", "mul", "mul_", "div", "maximum", "minimum"}
_REDUCE_FUNCTIONS = {torch.mean, torch.sum, torch.amax, torch.amin}
_REDUCE_METHODS = {"mean", "sum", "amax", "amin"}
_FLATTEN_FUNCTIONS = {torch.flatten, torch.reshape}
_FLATTEN_METHODS = {"flatten", "view", "reshape"}
_NON_TENSOR_METHODS = {"size", "dim"}


class _Tracer:
    """Union-find over spaces plus the per-node value table."""

    def __init__(self, gm: torch.fx.GraphModule, on_unsupported: OnUnsupported) -> None:
        self.gm = gm
        self.modules = dict(gm.named_modules())
        self.on_unsupported = on_unsupported
        self.parent: list[int] = []
        self.size: list[int] = []
        self.frozen: list[bool] = []
        self.creator: list[str] = []
        self.module_space: dict[str, int] = {}
        self.bindings: list[tuple[str, AxisBinding, int]] = []  # (tensor key, binding with space placeholder, space id)
        self.probes: list[tuple[int, Probe]] = []
        self.writers: list[tuple[str, int, torch.fx.Node]] = []
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
            raise TraceError(f"node {node.name!r} joins spaces of sizes {self.size[ra]} and {self.size[rb]}")
        ra, rb = min(ra, rb), max(ra, rb)
        self.parent[rb] = ra
        self.frozen[ra] = self.frozen[ra] or self.frozen[rb]

    def freeze(self, v: Any) -> None:
        for val in _tensor_vals(v):
            for s in val.segs:
                self.frozen[self.find(s.space)] = True

    def frozen_val(self, node: torch.fx.Node) -> _Val | None:
        shape = _shape(node)
        if shape is None:
            return None
        dim = 1 if len(shape) >= 2 else 0
        n = shape[dim] if shape else 1
        return _Val(dim, len(shape), (_Seg(self.new_space(n, node.name, frozen=True), n),))

    # ---------------------------------------------------------------- bookkeeping
    def bind(self, key: str, axis: int, val: _Val, side: str) -> None:
        offset = 0
        for s in val.segs:
            partial = len(val.segs) > 1
            self.bindings.append((key, AxisBinding(axis, "", side, s.block, offset, partial), s.space))
            offset += s.n * s.block

    def module_out_space(self, name: str, n: int) -> int:
        if name not in self.module_space:
            self.module_space[name] = self.new_space(n, name)
        return self.module_space[name]

    def unsupported(self, node: torch.fx.Node, why: str) -> _Val | None:
        msg = f"unsupported operation at node {node.name!r} ({node.op} {_target_name(node)}): {why}"
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
                self.vals[node] = self.frozen_val(node)
            elif node.op == "output":
                for a in _flat_args(node):
                    self.freeze(self.vals.get(a))
            elif node.op == "call_module":
                self.vals[node] = self.call_module(node)
            else:
                self.vals[node] = self.call_other(node)

    def arg_val(self, node: torch.fx.Node, i: int = 0) -> _Val | None:
        a = node.args[i] if i < len(node.args) else None
        return self.vals.get(a) if isinstance(a, torch.fx.Node) else None

    # ---------------------------------------------------------------- modules
    def call_module(self, node: torch.fx.Node) -> _Val | None:
        name = str(node.target)
        mod = self.modules[name]
        x = self.arg_val(node)
        if x is None:
            return self.unsupported(node, "module input is not a tensor")
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
        if isinstance(mod, _ELEMENTWISE_MODULES):
            return x
        if isinstance(mod, (nn.Softmax, nn.LogSoftmax)):
            return x
        if isinstance(mod, _POOL_MODULES):
            return self.require_dim(node, x, 1)
        if isinstance(mod, nn.Flatten):
            return self.flatten(node, x)
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

    def all_frozen(self, x: _Val) -> bool:
        return all(self.frozen[self.find(s.space)] for s in x.segs)

    def writer(self, node, name: str, x: _Val, dim: int, n_out: int, in_axis: int | None) -> _Val:
        x = self.require_dim(node, x, dim)
        if in_axis is not None:
            self.bind(f"{name}.weight", in_axis, x, "in")
            self.probes.extend((s.space, Probe(name, "input", dim, off, s.block)) for s, off in _offsets(x))
        space = self.module_out_space(name, n_out)
        out = _Val(dim, _shape_len(node, x.ndim), (_Seg(space, n_out),))
        self.bind(f"{name}.weight", 0, out, "out")
        if getattr(self.modules[name], "bias", None) is not None:
            self.bind(f"{name}.bias", 0, out, "out")
        self.writers.append((name, space, node))
        return out

    def conv(self, node, name: str, mod: nn.Module, x: _Val) -> _Val | None:
        x = self.require_dim(node, x, 1)
        if mod.groups == 1:
            if any(s.block != 1 for s in x.segs):
                return self.unsupported(node, "convolution over a flattened input")
            return self.writer(node, name, x, 1, mod.out_channels, in_axis=1)
        if mod.groups == mod.in_channels == mod.out_channels:  # depthwise: each channel is its own group
            self.bind(f"{name}.weight", 0, x, "out")
            if mod.bias is not None:
                self.bind(f"{name}.bias", 0, x, "out")
            return x
        return self.unsupported(
            node, f"grouped convolution (groups={mod.groups}, in={mod.in_channels}, out={mod.out_channels}) "
            "only admits group-preserving permutations"
        )

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
    def call_other(self, node: torch.fx.Node) -> _Val | None:
        t = node.target
        is_method = node.op == "call_method"
        if _shape(node) is None and (is_method and t in _NON_TENSOR_METHODS or t is operator.getitem or t is getattr):
            return None
        x = self.arg_val(node)
        if (is_method and t in _ELEMENTWISE_METHODS) or (not is_method and t in _ELEMENTWISE_FUNCTIONS):
            return x if x is not None else self.frozen_val(node)
        if (is_method and t in _BINARY_METHODS) or (not is_method and t in _BINARY):
            return self.binary(node)
        if not is_method and t in _POOL_FUNCTIONS:
            return self.require_dim(node, x, 1)
        if (is_method and t in _FLATTEN_METHODS) or (not is_method and t in _FLATTEN_FUNCTIONS):
            return self.flatten(node, x)
        if (is_method and t in _REDUCE_METHODS) or (not is_method and t in _REDUCE_FUNCTIONS):
            return self.reduce(node, x)
        if (is_method and t in ("permute", "transpose")) or (not is_method and t in (torch.permute, torch.transpose)):
            return self.permute(node, x)
        if not is_method and t is torch.cat:
            return self.cat(node)
        return self.unsupported(node, "no symmetry rule for this operation")

    def binary(self, node: torch.fx.Node) -> _Val | None:
        vals = [self.vals.get(a) for a in node.args[:2] if isinstance(a, torch.fx.Node)]
        vals = [v for v in vals if v is not None]
        if not vals:
            return self.frozen_val(node)
        if len(vals) == 1:
            if _shape(node) != _shape_of_val_node(node, vals[0], self):
                return self.unsupported(node, "broadcasting against a non-tensor changes the shape")
            return vals[0]
        a, b = vals
        if a.ndim != b.ndim or a.dim != b.dim or len(a.segs) != len(b.segs) or any(
            (sa.n, sa.block) != (sb.n, sb.block) for sa, sb in zip(a.segs, b.segs)
        ):
            if a.width == b.width and a.dim == b.dim:
                self.freeze(a)
                self.freeze(b)
                return a
            return self.unsupported(node, "operands carry different symmetry layouts")
        for sa, sb in zip(a.segs, b.segs):
            self.union(sa.space, sb.space, node)
        return a

    def flatten(self, node: torch.fx.Node, x: _Val | None) -> _Val | None:
        if x is None:
            return self.frozen_val(node)
        in_shape, out_shape = _shape(node.args[0]), _shape(node)
        if in_shape is None or out_shape is None:
            return self.unsupported(node, "shape unknown")
        if in_shape == out_shape:
            return x
        merged = _merged_range(in_shape, out_shape)
        if merged is None:
            if self.all_frozen(x):
                return self.frozen_val(node)
            return self.unsupported(node, f"reshape {in_shape} → {out_shape} is not a flatten of adjacent dims")
        s, e = merged
        if x.dim < s:
            return _Val(x.dim, len(out_shape), x.segs)
        if x.dim > e:
            return _Val(x.dim - (e - s), len(out_shape), x.segs)
        if x.dim != s:
            if self.all_frozen(x):
                return self.frozen_val(node)
            return self.unsupported(node, "flatten interleaves the channel dim with earlier dims")
        inner = math.prod(in_shape[s + 1 : e + 1])
        return _Val(s, len(out_shape), tuple(_Seg(g.space, g.n, g.block * inner) for g in x.segs))

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
        new_dim = x.dim if keepdim else x.dim - sum(d < x.dim for d in dims)
        return _Val(new_dim, _shape_len(node, x.ndim), x.segs)

    def permute(self, node: torch.fx.Node, x: _Val | None) -> _Val | None:
        if x is None:
            return self.frozen_val(node)
        if node.target in ("transpose", torch.transpose):
            a, b = (d % x.ndim for d in node.args[1:3])
            new_dim = b if x.dim == a else a if x.dim == b else x.dim
        else:
            order = node.args[1] if len(node.args) == 2 and isinstance(node.args[1], (tuple, list)) else node.args[1:]
            new_dim = [d % x.ndim for d in order].index(x.dim)
        return _Val(new_dim, x.ndim, x.segs)

    def cat(self, node: torch.fx.Node) -> _Val | None:
        parts = node.args[0]
        dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0)
        vals = [self.vals.get(p) for p in parts]
        if any(v is None for v in vals):
            return self.unsupported(node, "concatenation of non-tensor values")
        ndim = vals[0].ndim
        dim %= ndim
        if any(v.dim != vals[0].dim for v in vals):
            return self.unsupported(node, "concatenated tensors carry their symmetry on different dims")
        if dim == vals[0].dim:
            return _Val(dim, ndim, tuple(s for v in vals for s in v.segs))
        for v in vals[1:]:
            for sa, sb in zip(vals[0].segs, v.segs):
                self.union(sa.space, sb.space, node)
        return vals[0]

    # ---------------------------------------------------------------- result
    def build_spec(self, model: nn.Module) -> SymmetrySpec:
        roots = {}
        for i in range(len(self.parent)):
            r = self.find(i)
            if not self.frozen[r] and r not in roots:
                roots[r] = f"P_{self.creator[r]}"
        sd = model.state_dict()
        tensors: dict[str, list[AxisBinding]] = {k: [] for k in sd}
        for key, b, sid in self.bindings:
            r = self.find(sid)
            if r in roots:
                if key not in tensors:
                    raise TraceError(f"traced binding for {key!r}, which is not in the model's state dict")
                tensors[key].append(AxisBinding(b.axis, roots[r], b.side, b.block, b.offset, b.partial))
        spaces = {name: Space(name, self.size[r]) for r, name in roots.items()}
        probes: dict[str, list[Probe]] = {name: [] for name in spaces}
        for sid, p in self.probes:
            r = self.find(sid)
            if r in roots:
                probes[roots[r]].append(p)
        return SymmetrySpec(
            spaces=spaces,
            tensors={k: tuple(v) for k, v in tensors.items()},
            shapes={k: tuple(t.shape) for k, t in sd.items()},
            probes={k: tuple(v) for k, v in probes.items()},
            repair_points=tuple(self.repair_points(roots)),
        )

    def repair_points(self, roots: dict[int, str]) -> list[tuple[str, int]]:
        """Where REPAIR corrects statistics: each hidden writer, or the norm layer right after it."""
        points = []
        for name, sid, node in self.writers:
            if self.find(sid) not in roots:
                continue
            target, dim = name, self.vals[node].dim
            users = list(node.users)
            if len(users) == 1 and users[0].op == "call_module":
                nxt = self.modules[str(users[0].target)]
                if isinstance(nxt, _NORM_MODULES) and getattr(nxt, "weight", None) is not None:
                    target = str(users[0].target)
            points.append((target, dim))
        return points


def symmetry_spec(
    model: nn.Module,
    example_input: torch.Tensor | tuple[torch.Tensor, ...],
    *,
    on_unsupported: OnUnsupported = "error",
    leaf_modules: tuple[type[nn.Module], ...] = (),
) -> SymmetrySpec:
    """Trace ``model`` with torch.fx and derive its permutation symmetries.

    Args:
        model: any nn.Module built from the supported layers (see module docstring). Not modified: its
            train/eval flags are restored and shape propagation runs under ``no_grad`` in eval mode.
        example_input: a tensor (or tuple of tensors) of the shape the model takes, e.g. (N, C, H, W).
        on_unsupported: ``"error"`` (default) raises :class:`UnsupportedOperationError` naming the node;
            ``"freeze"`` leaves every space touching such a node unpermuted.
    Returns: a validated :class:`SymmetrySpec` (every state-dict tensor listed exactly once; input and
        output spaces never permuted).
    Raises: :class:`ConfigError` for a bad option, :class:`TraceError` if fx cannot trace the model.
    """
    if on_unsupported not in ("error", "freeze"):
        raise ConfigError(f"on_unsupported must be 'error' or 'freeze', got {on_unsupported!r}")
    inputs = example_input if isinstance(example_input, tuple) else (example_input,)
    gm = _fx_trace(model, leaf_modules)
    flags = {m: m.training for m in model.modules()}
    try:
        model.eval()
        with torch.no_grad():
            ShapeProp(gm).propagate(*inputs)
    except Exception as exc:  # noqa: BLE001 - any failure of the example forward is a user-facing trace error
        raise TraceError(f"running {type(model).__name__} on the example input failed: {exc}") from exc
    finally:
        for m, flag in flags.items():
            m.training = flag
    tracer = _Tracer(gm, on_unsupported)
    tracer.run()
    spec = tracer.build_spec(model)
    spec.validate(model)
    return spec


def _fx_trace(model: nn.Module, leaf_modules: tuple[type[nn.Module], ...]) -> torch.fx.GraphModule:
    class _Tr(torch.fx.Tracer):
        # Subclasses of the layers we have rules for (e.g. W-asymmetric Linear/Conv2d) stay one node, like
        # the stock layer; fx alone would trace through any module defined outside torch.nn.
        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            return isinstance(m, leaf_modules + _RULE_MODULES) or super().is_leaf_module(m, qualname)

    try:
        graph = _Tr().trace(model)
    except Exception as exc:  # noqa: BLE001
        raise TraceError(
            f"torch.fx could not trace {type(model).__name__}: {exc}. Models with data-dependent control flow "
            "need a hand-written spec (SymmetrySpec.from_axes) or an adapter."
        ) from exc
    return torch.fx.GraphModule(model, graph)


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


def _shape_of_val_node(node: torch.fx.Node, val: _Val, tracer: _Tracer) -> tuple[int, ...] | None:
    for a in node.args[:2]:
        if isinstance(a, torch.fx.Node) and tracer.vals.get(a) is val:
            return _shape(a)
    return None


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


def _offsets(x: _Val):
    off = 0
    for s in x.segs:
        yield s, off
        off += s.n * s.block


def _tensor_vals(v: Any):
    if isinstance(v, _Val):
        yield v


def _flat_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    out: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda n: out.append(n) or n)
    return out


def _target_name(node: torch.fx.Node) -> str:
    t: Callable | str = node.target
    return t if isinstance(t, str) else getattr(t, "__qualname__", None) or getattr(t, "__name__", repr(t))
