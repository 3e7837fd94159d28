"""The spec assembled from a finished trace: one space per live union-find root, each tensor's bindings expanded to
the unsplit spaces they cover, probes for the self-check and activation matching, and REPAIR points."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
import torch.fx
from torch import nn

from ...errors import TraceError, UnsupportedOperationError
from ..spec import AxisBinding, Probe, Space, SymmetrySpec
from .ops.elementwise import ELEMENTWISE_MODULES, POOL_FUNCTIONS, POOL_MODULES
from .ops.norms import FUNCTIONAL_NORM_WEIGHT, NORM_MODULES
from .values import NON_TENSOR_METHODS, Attr, Pair

if TYPE_CHECKING:
    from .tracer import Tracer


def build_spec(tr: Tracer, model: nn.Module) -> SymmetrySpec:
    for key, (_, val) in tr.attr_bound.items():
        if key in tr.attr_frozen:  # also read where it cannot be permuted
            if tr.on_unsupported == "error" and not tr.inactive(val):
                raise UnsupportedOperationError(
                    f"parameter {key!r} moves with a permuted space where it is combined with activations, but is "
                    "also read where it cannot move (an operation without a symmetry rule on it); freezing would "
                    "leave that space unpermuted. Pass on_unsupported='freeze' to accept that, or register_rule")
            tr.freeze(val)
    roots = {}
    for i in range(len(tr.parent)):
        r = tr.find(i)
        if not tr.frozen[r] and r not in tr.children and r not in roots:
            roots[r] = f"P_{tr.creator[r]}"
    sd = model.state_dict()
    tensors: dict[str, list[AxisBinding]] = {k: [] for k in sd}
    for key, b, sid in tr.bindings:
        leaves = tr.leaves(sid, b.block, b.offset)
        for r, off in leaves:
            if r in roots:
                if key not in tensors:
                    raise TraceError(f"traced binding for {key!r}, which is not in the model's state dict")
                tensors[key].append(replace(b, space=roots[r], offset=off, partial=b.partial or len(leaves) > 1))
    spaces = {name: Space(name, tr.size[r]) for r, name in roots.items()}
    probes: dict[str, list[Probe]] = {name: [] for name in spaces}
    add_probes(tr, probes, roots, tr.probes, set(spaces))
    # writer outputs only where no writer reads the space (q/k heads: QKᵀ is their only reader)
    add_probes(tr, probes, roots, tr.out_probes, {s for s, p in probes.items() if not p})
    return SymmetrySpec(
        spaces=spaces,
        tensors={k: tuple(v) for k, v in tensors.items()},
        shapes={k: tuple(t.shape) for k, t in sd.items()},
        probes={k: tuple(v) for k, v in probes.items()},
        repair_points=tuple(repair_points(tr, roots)),
        buffers=frozenset(k for k, _ in model.named_buffers() if k in sd),
    )


def add_probes(
    tr: Tracer, probes: dict[str, list[Probe]], roots: dict[int, str], found: list[tuple[int, Probe]], wanted: set[str]
) -> None:
    for sid, p in found:
        for r, off in tr.leaves(sid, p.block, p.offset):
            if r in roots and roots[r] in wanted:
                probes[roots[r]].append(replace(p, offset=off))


def repair_points(tr: Tracer, roots: dict[int, str]) -> list[tuple]:
    """Where REPAIR corrects statistics: each hidden writer, or the affine norm layers right after it — also when
    they read it through concatenations and pooling (DenseNet: a bias-free conv whose channels every later
    layer's norm reads), where the norms' outputs are corrected instead (each once)."""
    points: list[tuple[str, int]] = []
    for name, sid, node in tr.writers:
        if tr.find(sid) not in roots:
            continue
        norms = norms_behind(tr, node)
        out = tr.vals[node]
        for point in norms or [(name, out.vals[0].dim if isinstance(out, Pair) else out.dim)]:  # a Pair's writer dim first
            if point not in points:
                points.append(point)
    return points


def norms_behind(tr: Tracer, node: torch.fx.Node, depth: int = 0) -> list[tuple[str, int]] | None:
    """The affine norm layers (name, channel dim) that every use of ``node`` reaches directly or through
    ``torch.cat`` and pooling only (DenseNet's transitions pool before the next block concatenates); None if some
    use is anything else."""
    found: list[tuple[str, int]] = []
    for u in node.users:
        if u.target is getattr or u.op == "call_method" and u.target in NON_TENSOR_METHODS:
            continue  # x.ndim, x.size(): shape checks read no values
        mod = tr.modules.get(str(u.target)) if u.op == "call_module" else None
        if isinstance(mod, NORM_MODULES) and getattr(mod, "weight", None) is not None and tr.vals.get(u) is not None:
            found.append((str(u.target), tr.vals[u].dim))
        elif u.op == "call_function" and u.target in FUNCTIONAL_NORM_WEIGHT:
            point = functional_norm_point(tr, u)
            if point is None:
                return None
            found.append(point)
        elif depth < 256 and (u.op == "call_function" and u.target in (torch.cat, torch.concat, *POOL_FUNCTIONS)
                              or isinstance(mod, POOL_MODULES)):
            sub = norms_behind(tr, u, depth + 1)
            if sub is None:
                return None
            found += sub
        else:
            return None
    return found or None


def functional_norm_point(tr: Tracer, u: torch.fx.Node) -> tuple[str, int, str] | None:
    """A norm computed by ``F.batch_norm`` / ``F.layer_norm`` inside a module whose forward adds an activation
    (timm's ``BatchNormAct2d``): ``(module owning the affine, channel dim, the elementwise module reading the
    norm's output)`` — REPAIR corrects that module's *input* (before the activation) and folds into the affine."""
    index, name = FUNCTIONAL_NORM_WEIGHT[u.target]
    arg = u.kwargs.get(name, u.args[index] if len(u.args) > index else None)
    a = tr.vals.get(arg) if isinstance(arg, torch.fx.Node) else None
    if not isinstance(a, Attr) or a.key is None or tr.vals.get(u) is None or len(u.users) != 1:
        return None
    owner = a.key.rsplit(".", 1)[0]
    (reader,) = u.users
    mod = tr.modules.get(str(reader.target)) if reader.op == "call_module" else None
    if not isinstance(mod, ELEMENTWISE_MODULES) or getattr(tr.modules.get(owner), "bias", None) is None:
        return None
    return owner, tr.vals[u].dim, str(reader.target)
