"""Mixture-of-Experts blocks of the pre-norm tables (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GraniteMoE).

transformers 5 stores a layer's experts as two stacked banks — ``experts.gate_up_proj`` (E, 2I, d) with the rows of
each expert laid out ``[gate | up]``, and ``experts.down_proj`` (E, d, I) — next to a router with one row per expert
(``gate.weight`` / ``router.weight``, (E, d)). Some families add a *shared* expert, a dense GLU every token passes
through, scaled by a sigmoid gate that reads the stream (Qwen2-MoE: ``shared_expert``, ``shared_expert_gate``).

The symmetries: experts permute together with their router rows (the router's softmax / top-k is equivariant
under a permutation of the experts, and each routing weight follows its expert); inside each expert the ``I``
hidden units permute on their own (an FFN per expert); the shared expert's hidden units permute as a dense FFN;
the stream is read by the router, the banks' ``d`` columns, the shared expert and its gate, and written by the
banks' ``d`` rows of ``down_proj`` and the shared expert's ``down_proj``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...errors import UnsupportedOperationError
from ._common import Walker, join
from .structure import FFN, Experts, LinearRef, Slice


@dataclass(frozen=True)
class MoE:
    """Where a table's Mixture-of-Experts block keeps its parts, relative to the layer's MLP module: the experts
    module (stacked banks ``gate_up_proj`` and ``down_proj``), the router and, where present, the shared expert
    (a dense MLP of the table's ``up``/``gate``/``down`` names) and the gate that scales it."""

    experts: str = "experts"
    router: str = "gate"
    gate_up: str = "gate_up_proj"
    down: str = "down_proj"
    shared: str | None = None
    shared_gate: str | None = None


@dataclass(frozen=True)
class Block:
    """What one MLP position contributes: dense FFNs, MoE layers, the linear maps reading the stream (through the
    norm before the block) and the slices writing it."""

    ffns: tuple[FFN, ...]
    experts: tuple[Experts, ...]
    readers: tuple[LinearRef, ...]
    writers: tuple[Slice, ...]


Dense = Callable[[str], tuple[FFN, tuple[LinearRef, ...], LinearRef]]
"""``dense(mlp_path)``: the table's dense FFN at ``mlp_path`` (its FFN, the linear maps reading the stream, the
writer)."""


def is_moe(W: Walker, moe: MoE | None, mp: str) -> bool:
    """Whether the MLP at ``mp`` is a Mixture-of-Experts block (some Qwen-MoE layers are dense: ``mlp_only_layers``)."""
    return moe is not None and W.has(join(mp, moe.experts))


def _router(W: Walker, path: str, count: int, hidden: int) -> LinearRef:
    m = W.mod(path)
    w = getattr(m, "weight", None)
    if w is None or tuple(w.shape) != (count, hidden):
        raise UnsupportedOperationError(f"{W.family} adapter: router {path!r} has no ({count}, {hidden}) weight")
    bias = W.key(path, "bias") if getattr(m, "bias", None) is not None else None
    return LinearRef(join(W.prefix, path), W.key(path, "weight"), bias, 0, 1, count, hidden)


def _banks(W: Walker, moe: MoE, ep: str, hidden: int) -> tuple[LinearRef, LinearRef, int, int]:
    """``(gate_up, down, experts, hidden units per expert)`` of the experts module at ``ep``."""
    m = W.mod(ep)
    gu, dn = getattr(m, moe.gate_up, None), getattr(m, moe.down, None)
    if gu is None or dn is None or gu.ndim != 3 or dn.ndim != 3:
        raise UnsupportedOperationError(f"{W.family} adapter: {ep!r} has no stacked {moe.gate_up!r} and {moe.down!r} "
                                        "banks (experts as one 3-D tensor each, transformers ≥ 5)")
    count, size = gu.shape[0], gu.shape[1] // 2
    if tuple(gu.shape) != (count, 2 * size, hidden) or tuple(dn.shape) != (count, hidden, size):
        raise UnsupportedOperationError(f"{W.family} adapter: expert banks of shapes {tuple(gu.shape)} and "
                                        f"{tuple(dn.shape)} in {ep!r}; expected (E, 2I, {hidden}) and (E, {hidden}, I)")
    path = join(W.prefix, ep)
    return (LinearRef(path, W.key(ep, moe.gate_up), None, 1, 2, 2 * size, hidden),
            LinearRef(path, W.key(ep, moe.down), None, 1, 2, hidden, size), count, size)


def describe_moe(W: Walker, moe: MoE, mp: str, hidden: int, activation: str, dense: Dense) -> Block:
    """The :class:`Block` of the Mixture-of-Experts MLP at ``mp``. UnsupportedOperationError naming the module whose
    layout differs."""
    gu, dn, count, size = _banks(W, moe, join(mp, moe.experts), hidden)
    router = _router(W, join(mp, moe.router), count, hidden)
    experts = Experts(join(W.prefix, mp), count, size, router.rows(), ((Slice(gu.weight, 0), "out"),
                      (Slice(dn.weight, 0), "in")), up=(Slice(gu.weight, 1, size, size),),
                      down=(Slice(dn.weight, 2, 0, size),), gate=(Slice(gu.weight, 1, 0, size),), activation=activation)
    readers, writers, ffns = [router, gu], [*dn.rows()], []
    if moe.shared is not None and W.has(join(mp, moe.shared)):
        ffn, shared_readers, shared_down = dense(join(mp, moe.shared))
        ffns.append(ffn)
        readers += shared_readers
        writers += shared_down.rows()
        if moe.shared_gate is not None:
            readers.append(W.linear(join(mp, moe.shared_gate)))  # one output (a scalar gate): only its columns move
    return Block(tuple(ffns), (experts,), tuple(readers), tuple(writers))


def dense_block(dense: Dense, mp: str) -> Block:
    """The :class:`Block` of a dense MLP."""
    ffn, readers, down = dense(mp)
    return Block((ffn,), (), readers, tuple(down.rows()))


def block(W: Walker, moe: MoE | None, mp: str, hidden: int, activation: str, dense: Dense) -> Block:
    """The MLP at ``mp``: a Mixture-of-Experts block where the table has one and the layer is sparse, else dense."""
    if is_moe(W, moe, mp):
        return describe_moe(W, moe, mp, hidden, activation, dense)
    return dense_block(dense, mp)
