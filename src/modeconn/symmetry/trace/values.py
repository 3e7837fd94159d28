"""What the tracer knows about each fx node's value: the spaces laid out along its permuted dim, and small
helpers reading a node's shape, arguments and name."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

NON_TENSOR_METHODS = {"size", "dim"}
"""Tensor methods whose result is not a tensor (shape checks read no values)."""


@dataclass(frozen=True)
class Seg:
    space: int
    n: int
    block: int = 1


@dataclass(frozen=True)
class Val:
    """A tensor value: symmetry acts on ``dim``, laid out as ``segs`` along it.

    With ``outer`` set (per-head values, e.g. (N, heads, T, head_dim)), ``segs[i]`` is the whole layout of
    ``dim`` at index ``i`` of axis ``outer``: a different space per head, and ``len(segs) == shape[outer]``.
    """

    dim: int
    ndim: int
    segs: tuple[Seg, ...]
    outer: int | None = None

    @property
    def width(self) -> int:
        return sum(s.n * s.block for s in self.segs)

    def remap(self, axis: Callable[[int], int], ndim: int) -> Val:
        """The same spaces after the axes moved (``axis(old) -> new``) in a tensor of ``ndim`` dims."""
        return Val(axis(self.dim), ndim, self.segs, None if self.outer is None else axis(self.outer))


@dataclass(frozen=True)
class Parts:
    """A tensor whose slices along ``axis`` carry different values: a fused q/k/v projection reshaped to
    (…, 3, heads, head_dim) (timm's ViT). ``vals[i]`` is slice ``i``'s value in the coordinates of the whole tensor;
    only moving axes (permute/transpose) and taking the slices apart (``unbind``, ``x[i]``) keep it."""

    axis: int
    vals: tuple[Val, ...]

    def remap(self, axis: Callable[[int], int], ndim: int) -> Parts:
        return Parts(axis(self.axis), tuple(v.remap(axis, ndim) for v in self.vals))

    def take(self, i: int) -> Val:
        """Slice ``i`` with the part axis removed."""
        v = self.vals[i]
        return v.remap(lambda d: d - (d > self.axis), v.ndim - 1)


@dataclass(frozen=True)
class Pair:
    """A tensor with symmetry on two dims: ``kᵀ v`` in linear and channel attention, of shape (…, key dims, value
    dims), permuted along both. ``vals[i]`` is one dim's layout in the coordinates of the whole tensor (each with its
    own per-head axis or none); the two act on different dims."""

    vals: tuple[Val, Val]

    def remap(self, axis: Callable[[int], int], ndim: int) -> Pair:
        return Pair(tuple(v.remap(axis, ndim) for v in self.vals))  # type: ignore[arg-type]


@dataclass(frozen=True)
class AttrCat:
    """A 1-D concatenation of tensors read by ``get_attr`` (BEiT's q/k/v bias ``cat((q_bias, k_bias, v_bias))``, its
    ``k_bias`` a constant buffer outside the state dict): ``parts`` = (tensor, length, constant along its length)."""

    parts: tuple[tuple[Attr, int, bool], ...]


@dataclass(frozen=True)
class Attr:
    """A tensor read by a ``get_attr`` node: a parameter/buffer ``key`` of the state dict, or ``None`` for a
    tensor outside it (which can never be permuted)."""

    key: str | None
    shape: tuple[int, ...]
    stored: tuple[int, ...] | None = None  # the stored shape when ``shape`` is a view adding/removing size-1 dims
    order: tuple[int, ...] | None = None  # the stored axis of each axis when ``shape`` is a transposed view

    def stored_axis(self, axis: int) -> int:
        """The axis of the stored tensor that axis ``axis`` of this (possibly reshaped or transposed) view is."""
        if self.order is not None:
            return self.order[axis]
        if self.stored is None:
            return axis
        rank = sum(1 for d in self.shape[:axis] if d != 1)
        return [i for i, d in enumerate(self.stored) if d != 1][rank]


def shape_of(node: Any) -> tuple[int, ...] | None:
    if not isinstance(node, torch.fx.Node):
        return None
    meta = node.meta.get("tensor_meta")
    shape = getattr(meta, "shape", None)
    return tuple(shape) if shape is not None else None


def shape_len(node: torch.fx.Node, default: int) -> int:
    shape = shape_of(node)
    return len(shape) if shape is not None else default


def same_layout(a: Val, b: Val) -> bool:
    """Whether two values carry their symmetry on the same dim (and head axis) with segments of equal sizes."""
    return (a.ndim, a.dim, a.outer, len(a.segs)) == (b.ndim, b.dim, b.outer, len(b.segs)) and all(
        (sa.n, sa.block) == (sb.n, sb.block) for sa, sb in zip(a.segs, b.segs, strict=False)
    )


def constant_along(out_shape: tuple[int, ...] | None, shape: tuple[int, ...] | None, dim: int) -> bool:
    """Whether a tensor of ``shape``, broadcast to ``out_shape``, is constant along ``dim`` (missing or size 1)."""
    if out_shape is None or shape is None:
        return False
    axis = dim - (len(out_shape) - len(shape))
    return axis < 0 or shape[axis] == 1


def whole_segments(x: Val, i: slice) -> tuple[Seg, ...] | None:
    """The segments a contiguous slice of the permuted dim takes whole (GhostNet's ``out[:, :n]`` of a concatenation);
    None if it cuts through one or has a step."""
    start, stop, step = i.indices(x.width)
    if step != 1:
        return None
    taken = [(s, off) for s, off in offsets(x) if off < stop and off + s.n * s.block > start]
    if not taken or taken[0][1] != start or taken[-1][1] + taken[-1][0].n * taken[-1][0].block != stop:
        return None
    return tuple(s for s, _ in taken)


def offsets(x: Val) -> Iterator[tuple[Seg, int]]:
    off = 0
    for s in x.segs:
        yield s, off
        off += s.n * s.block


def flat_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    out: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda n: out.append(n) or n)
    return out


def module_of(node: torch.fx.Node) -> str:
    """`` in module 'path' (Type)``: the innermost module whose forward holds ``node`` (fx's ``nn_module_stack``)."""
    if node.op == "call_module":
        return ""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path, cls = list(stack.values())[-1]
    name = getattr(cls, "__name__", str(cls).rsplit(".", 1)[-1].rstrip("'>"))
    return f" in module {path!r} ({name})" if path else f" in {name}.forward"


def target_name(node: torch.fx.Node) -> str:
    t: Callable | str = node.target
    return t if isinstance(t, str) else getattr(t, "__qualname__", None) or getattr(t, "__name__", repr(t))


def matches(node: torch.fx.Node, methods: Collection[str], functions: Collection[Any]) -> bool:
    """Whether ``node`` calls one of ``methods`` (a ``call_method`` node) or of ``functions``."""
    return node.target in (methods if node.op == "call_method" else functions)
