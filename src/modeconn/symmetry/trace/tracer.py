"""The tracer: one pass over the fx graph in topological order, each node's value from the op rule of its
target (:mod:`.registry`), over the union-find of axes (:class:`~.axes.Axes`)."""

from __future__ import annotations

import operator
from dataclasses import replace
from typing import Any, Literal

import torch
import torch.fx
from torch import nn

from ...errors import UnsupportedOperationError
from ..spec import AxisBinding, Probe
from . import assembly
from .axes import Axes
from .leaves import layer_in_stack, registered, tables, untraceable_layer
from .ops import attention, linear, norms
from .ops.attention import parts_op
from .ops.pairs import pair_op
from .ops.elementwise import elementwise, softmax_module
from .ops.indexing import index
from .ops.reshape import parameter_view
from .registry import module_op_for, node_op_for
from .values import (
    NON_TENSOR_METHODS,
    Attr,
    AttrCat,
    Pair,
    Parts,
    Seg,
    Val,
    flat_args,
    matches,
    module_of,
    offsets,
    shape_of,
    target_name,
)

OnUnsupported = Literal["error", "freeze"]

# a parameter broadcast over the batch (a class token) or reshaped by size-1 dims (a layer scale): still that parameter
PARAMETER_VIEW_METHODS = {"expand", "expand_as", "reshape", "view", "unsqueeze", "squeeze"}
PARAMETER_VIEW_FUNCTIONS = {torch.reshape, torch.unsqueeze, torch.squeeze}


class Tracer(Axes):
    """The per-node value table and the bindings, probes and writers found so far, over the union-find of axes."""

    # rules reached through the tracer, so that a test can substitute a broken one (defined with their kind)
    norm = norms.norm
    output_parameters = linear.output_parameters
    fused_self_attention = attention.fused_self_attention
    build_spec = assembly.build_spec

    def __init__(self, gm: torch.fx.GraphModule, on_unsupported: OnUnsupported, state_keys: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.gm = gm
        self.modules = dict(gm.named_modules())
        self.on_unsupported = on_unsupported
        self.state_keys = state_keys
        self.module_space: dict[str, int] = {}
        self.bindings: list[tuple[str, AxisBinding, int]] = []  # (tensor key, binding with space placeholder, space id)
        self.bound_at: dict[tuple, int] = {}  # (key, axis, side, block, offset, units) → the space bound there
        self.probes: list[tuple[int, Probe]] = []
        self.out_probes: list[tuple[int, Probe]] = []  # writer outputs: probes for spaces no writer reads
        self.writers: list[tuple[str, int, torch.fx.Node]] = []
        self.attr_bound: dict[str, tuple[int, Val]] = {}  # parameter key → (axis, activations it is bound with)
        self.attr_frozen: set[str] = set()  # parameter keys read where they cannot be permuted
        self.vals: dict[torch.fx.Node, Any] = {}

    def freeze(self, v: Any) -> None:
        if isinstance(v, Attr):
            if v.key is not None:
                self.attr_frozen.add(v.key)
        elif isinstance(v, Val):
            for s in v.segs:
                self.set_frozen(s.space)
        elif isinstance(v, AttrCat):
            for a, _, _ in v.parts:
                self.freeze(a)
        elif isinstance(v, (Parts, Pair, tuple)):
            for part in (v if isinstance(v, tuple) else v.vals):
                self.freeze(part)

    def frozen_val(self, node: torch.fx.Node) -> Val | None:
        shape = shape_of(node)
        if shape is None:
            return None
        dim = 1 if len(shape) >= 2 else 0
        n = shape[dim] if shape else 1
        return Val(dim, len(shape), (Seg(self.new_space(n, node.name, frozen=True), n),))

    def all_frozen(self, x: Val) -> bool:
        return all(self.frozen[self.find(s.space)] for s in x.segs)

    def inactive(self, x: Val) -> bool:
        """No non-trivial permutation acts on ``x``: its spaces are frozen or of size 1."""
        return all(self.frozen[r] or self.size[r] == 1 for r in (self.find(s.space) for s in x.segs))

    def bind(self, key: str, axis: int, val: Val, side: str) -> None:
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

    def unsupported(self, node: torch.fx.Node, why: str) -> Val | None:
        msg = f"unsupported operation at node {node.name!r} ({node.op} {target_name(node)}{module_of(node)}): {why}"
        layer = layer_in_stack(node)
        if layer is not None and self.on_unsupported == "error":
            raise untraceable_layer(*layer, msg)
        if self.on_unsupported == "error":
            raise UnsupportedOperationError(
                msg + ". Pass on_unsupported='freeze' to leave the spaces touching it unpermuted."
            )
        for a in flat_args(node):
            self.freeze(self.vals.get(a))
        return self.frozen_val(node)

    def run(self) -> None:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.vals[node] = self.frozen_val(node)
            elif node.op == "get_attr":
                shape = shape_of(node)
                key = str(node.target)
                self.vals[node] = Attr(key if key in self.state_keys else None, shape) if shape is not None else None
            elif node.op == "output":
                for a in flat_args(node):
                    self.freeze(self.vals.get(a))
            elif node.op == "call_module":
                self.vals[node] = self.call_module(node)
            else:
                self.vals[node] = self.call_other(node)

    def value(self, a: Any) -> Val | None:
        """The traced value of argument ``a``. A parameter read here (anywhere but as an elementwise operand
        of activations, see :func:`.ops.binary.parameter_operand`) is never permuted: it becomes a frozen value."""
        v = self.vals.get(a) if isinstance(a, torch.fx.Node) else None
        if isinstance(v, (Attr, AttrCat)):
            self.freeze(v)
            return self.frozen_val(a)
        return v

    def arg_val(self, node: torch.fx.Node, i: int = 0) -> Val | None:
        return self.value(node.args[i]) if i < len(node.args) else None

    def require_dim(self, node: torch.fx.Node, x: Val, dim: int) -> Val:
        """``x`` if the symmetry acts on its ``dim`` (fully frozen values pass); else an error, or with
        ``on_unsupported="freeze"`` ``x``'s spaces frozen and an unpermuted value in their place (ECA's channel
        attention: a 1-D convolution across the channels, which no channel permutation commutes with)."""
        dim = dim % x.ndim if x.ndim else 0
        if x.dim == dim or self.all_frozen(x):
            return x
        if self.on_unsupported == "error":  # raises, naming the module and the way out
            self.unsupported(node, f"acts on dim {dim} but the symmetry of its input acts on dim {x.dim}")
        self.freeze(x)
        shape = shape_of(node.args[0]) if node.args else None
        n = shape[dim] if shape is not None else 1
        return Val(dim, x.ndim, (Seg(self.new_space(n, node.name, frozen=True), n),))

    def union_segs(self, a: Val, b: Val, node: torch.fx.Node) -> None:
        """Union the spaces of ``a`` and ``b`` segment by segment (same layout)."""
        for sa, sb in zip(a.segs, b.segs, strict=False):
            self.union(sa.space, sb.space, node)

    def refine(self, x: Val, cuts: set[int]) -> Val | None:
        """``x`` with every segment split at the positions ``cuts`` that fall inside it (its space split into
        consecutive parts, :meth:`split_at`); None if a cut falls inside a unit or a space is split differently."""
        segs: list[Seg] = []
        for s, off in offsets(x):
            inner = sorted(c for c in cuts if off < c < off + s.n * s.block)
            if any((c - off) % s.block for c in inner):
                return None
            bounds = [0, *((c - off) // s.block for c in inner), s.n]
            parts = self.split_at(s.space, [e - b for b, e in zip(bounds, bounds[1:], strict=False)])
            if parts is None:
                return None
            segs += [Seg(p, e - b, s.block) for p, b, e in zip(parts, bounds, bounds[1:], strict=False)]
        return replace(x, segs=tuple(segs))

    def join_heads(self, node: torch.fx.Node, x: Val) -> bool:
        """Union the spaces of every index of ``x.outer`` (an op mixing values across it needs one permutation for all);
        False if their layouts differ."""
        if any((s.n, s.block) != (x.segs[0].n, x.segs[0].block) for s in x.segs):
            return False
        for seg in x.segs[1:]:
            self.union(x.segs[0].space, seg.space, node)
        return True

    def call_module(self, node: torch.fx.Node) -> Val | None:
        name = str(node.target)
        mod = self.modules[name]
        x = self.arg_val(node)
        if x is None or isinstance(x, (Parts, Pair)):
            return self.unsupported(node, "module input is not a tensor" if x is None else "module reads a fused q/k/v value"
                                    if isinstance(x, Parts) else "module reads a value permuted along two dims")
        op = module_op_for(type(mod))
        if registered(type(mod)) == "elementwise" and (op is None or op.rule is not softmax_module):
            return x
        if op is None:
            return self.unsupported(node, f"module type {type(mod).__name__} has no symmetry rule")
        if not op.per_head and self.has_heads(x):
            return self.refuse_heads(node, mod, x)
        return op.rule(self, node, name, mod, x)

    def has_heads(self, x: Val) -> bool:
        """Whether ``x`` carries a different (not frozen) space per index of an axis (per attention head)."""
        return x.outer is not None and not self.all_frozen(x)

    def refuse_heads(self, node: torch.fx.Node, mod: nn.Module, x: Val) -> Val | None:
        return self.unsupported(node, f"{type(mod).__name__} on a value with a different space per index of axis {x.outer} "
                                "(e.g. per attention head)")

    def call_other(self, node: torch.fx.Node) -> Any:
        parts = [a for a in flat_args(node) if isinstance(self.vals.get(a), Parts)]
        if parts:
            return parts_op(self, node, self.vals[parts[0]]) if parts == [node.args[0]] else self.unsupported(
                node, "reads a fused q/k/v value other than by moving its axes or taking its parts apart")
        if any(isinstance(self.vals.get(a), Pair) for a in flat_args(node)):
            return pair_op(self, node)
        library = tables().LIBRARY_RULES
        if node.op == "call_function" and node.target in library:
            return library[node.target](self, node)
        found, val = self.special(node)
        if found:
            return val
        rule = node_op_for(node)
        if rule is not None:
            return rule(self, node)
        if self.reads_fixed_values_only(node):
            return self.frozen_val(node)
        return self.unsupported(node, "no symmetry rule for this operation")

    def reads_fixed_values_only(self, node: torch.fx.Node) -> bool:
        """Whether ``node`` reads only values no permutation acts on and constants outside the state dict (DINOv3's
        rotary angles computed from a coordinate grid): then so is its output, whatever the operation. Not inside an
        unregistered layer subclass (refused by name, :func:`.leaves.layer_in_stack`) nor for parameters."""
        vals = [self.vals.get(a) for a in flat_args(node)]
        if layer_in_stack(node) is not None or not any(isinstance(v, (Val, Attr)) for v in vals):
            return False
        return all(v is None or isinstance(v, Attr) and v.key is None or isinstance(v, Val) and self.inactive(v)
                   for v in vals)

    def special(self, node: torch.fx.Node) -> tuple[bool, Any]:
        """``(True, value)`` for nodes decided before the operator tables: tuple elements, non-tensor values (sizes,
        Python arithmetic, ``torch._assert``), registered elementwise ops, views of parameters, tensor indexing."""
        t, is_method = node.target, node.op == "call_method"
        first = self.vals.get(node.args[0]) if node.args and isinstance(node.args[0], torch.fx.Node) else None
        if t is operator.getitem and isinstance(first, tuple):  # an element of a module's tuple output
            return True, first[node.args[1]]
        if shape_of(node) is None and (is_method and t in NON_TENSOR_METHODS or t is operator.getitem or t is getattr):
            return True, None
        if shape_of(node) is None and not any(isinstance(self.vals.get(a), (Val, Attr)) for a in flat_args(node)):
            return True, None  # Python arithmetic on sizes, torch._assert(h == ...): no tensor, no symmetry
        if not is_method and t in tables().ELEMENTWISE_RULES:  # registered elementwise ops (stochastic depth, custom activations)
            return True, elementwise(self, node, self.arg_val(node))
        if isinstance(first, Attr) and first.stored is None and first.order is None and matches(
                node, {"transpose"}, {torch.transpose}):  # a relative-position table read as rel_kᵀ
            return True, transposed(first, *node.args[1:3])
        if isinstance(first, Attr) and first.order is None and matches(node, PARAMETER_VIEW_METHODS,
                                                                       PARAMETER_VIEW_FUNCTIONS):
            return True, first if t in ("expand", "expand_as") else parameter_view(self, node, first)
        if t is operator.getitem:
            return True, index(self, node)
        return False, None


def transposed(a: Attr, d0: int, d1: int) -> Attr:
    """``a.transpose(d0, d1)``: the same parameter, its axes swapped."""
    order = list(range(len(a.shape)))
    d0, d1 = d0 % len(order), d1 % len(order)
    order[d0], order[d1] = order[d1], order[d0]
    return Attr(a.key, tuple(a.shape[i] for i in order), None, tuple(order))
