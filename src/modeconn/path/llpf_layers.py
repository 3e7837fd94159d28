"""LLPF's layer bookkeeping (:mod:`modeconn.path.llpf`): which parameters a normalization owns, which tensors the
variance correction rescales and how, and the parameter groups in Follow-Data-Flow order the schedule unlocks."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.fx
import torch.nn as nn

from ..errors import ConfigError
from ..symmetry.trace import fx_trace
from .pathobj import param_names

NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, nn.LayerNorm, nn.GroupNorm,
    nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d, nn.LocalResponseNorm,
) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())
"""Normalization layers (found by type, never by name)."""

ORDERS = ("fdf", "all")
VARIANCE_CORRECTIONS = ("weights", "all", "none")


def param_owners(model: nn.Module) -> dict[str, str]:
    """``{parameter key: name of the module that owns it directly}``."""
    keys = set(param_names(model))
    out: dict[str, str] = {}
    for mname, m in model.named_modules():
        for pname, _ in m.named_parameters(recurse=False):
            key = f"{mname}.{pname}" if mname else pname
            if key in keys and key not in out:
                out[key] = mname
    return out


def norm_param_keys(model: nn.Module) -> set[str]:
    """Parameters owned by normalization layers (:data:`NORM_TYPES`)."""
    mods = dict(model.named_modules())
    return {k for k, owner in param_owners(model).items() if isinstance(mods[owner], NORM_TYPES)}


def weight_keys(model: nn.Module) -> list[str]:
    """≥2-d parameters of non-normalization modules (Linear/Conv kernels, embeddings): the "layers" whose
    variance LLPF corrects (``variance_correction="weights"``) and M2O's angle-conformal lr follows."""
    norm = norm_param_keys(model)
    return [n for n, p in model.named_parameters() if p.dim() >= 2 and n not in norm]


def corrected_keys(model: nn.Module, which: str = "weights") -> list[str]:
    """Tensors rescaled by the variance correction: ``"weights"`` (:func:`weight_keys`), ``"all"`` (every
    floating parameter with > 1 entry) or ``"none"``. Raises ConfigError for another value."""
    if which not in VARIANCE_CORRECTIONS:
        raise ConfigError(f"unknown variance_correction {which!r}; valid: {', '.join(VARIANCE_CORRECTIONS)}")
    if which == "weights":
        return weight_keys(model)
    if which == "all":
        return [n for n, p in model.named_parameters() if p.is_floating_point() and p.numel() > 1]
    return []


def tensor_variance(t: torch.Tensor) -> float:
    """Unbiased variance of all entries (float64); 0 for tensors with < 2 entries."""
    return float(torch.var(t.detach().double())) if t.numel() > 1 else 0.0


def scale_to_variance(t: torch.Tensor, target: float) -> torch.Tensor:
    """``mean + (t − mean)·sqrt(target/var(t))`` (computed in float64, returned in ``t``'s dtype): the same
    mean, unbiased variance ``target`` (to the dtype's precision). A constant tensor (variance 0) or one with
    < 2 entries is returned unchanged (copied). Raises ConfigError for a negative/non-finite target."""
    if not (target >= 0 and math.isfinite(target)):
        raise ConfigError(f"target variance must be finite and ≥ 0, got {target!r}")
    x = t.detach().double()
    if t.numel() < 2:
        return t.detach().clone()
    v = float(torch.var(x))
    if v == 0.0:
        return t.detach().clone()
    mu = x.mean()
    return (mu + (x - mu) * math.sqrt(target / v)).to(t.dtype)


@torch.no_grad()
def project_to_variance_(t: torch.Tensor, target: float) -> None:
    """In place, what :func:`scale_to_variance` returns: ``t ← mean + (t − mean)·sqrt(target/var(t))`` with the
    mean and unbiased variance from one ``var_mean`` pass and the update as ``t·f + mean·(1 − f)`` in ``t``'s dtype
    (two passes, no copy: LLPF projects every corrected tensor twice per tick). A constant tensor or one with < 2
    entries is left as it is."""
    if t.numel() < 2:
        return
    v, mu = (float(x) for x in torch.var_mean(t))
    if v == 0.0:
        return
    f = math.sqrt(target / v)
    t.mul_(f).add_(mu * (1.0 - f))


def fdf_groups(model: nn.Module, level: int | None = None) -> list[list[str]]:
    """Parameter groups in Follow-Data-Flow order (see the module docstring), from a torch.fx trace.

    Args:
        model: any fx-traceable model (Linear/Conv/Norm layers are leaves).
        level: None (default) — one group per parameterised layer (a normalization applied directly to a
            writer joins it; a residual shortcut is its own group); an int ≥ 1 — merge consecutive groups
            whose owning modules share the first ``level`` name components (ResNet20 with ``level=2``:
            stem, stages.0, stages.1, stages.2, head).

    Returns: lists of parameter keys (state-dict names), covering every parameter exactly once.
    Raises: TraceError (untraceable model: use ``order="all"`` or explicit groups), ConfigError (level).
    """
    if level is not None and (isinstance(level, bool) or not isinstance(level, int) or level < 1):
        raise ConfigError(f"level must be None or an integer ≥ 1, got {level!r}")
    gm = fx_trace(model, ())
    params = param_names(model)
    owners = param_owners(model)
    grouping = _FDFGrouping(gm, params)
    for node in gm.graph.nodes:
        if node.op == "call_module":
            grouping.add_module(node)
        elif node.op == "get_attr":
            grouping.add_attr(node)
    groups = grouping.close()
    return groups if level is None else _merge_groups(groups, owners, level)


class _FDFGrouping:
    """The groups of :func:`fdf_groups`, built in one pass over the fx graph ``gm`` of a model with parameters
    ``params``: every parameter is assigned to the first group that reaches it."""

    def __init__(self, gm: torch.fx.GraphModule, params: list[str]) -> None:
        self.gm, self.params, self.pset = gm, params, set(params)
        self.groups: list[list[str]] = []
        self.assigned: set[str] = set()
        self.writer_group: dict[torch.fx.Node, int] = {}  # node of a non-normalization module → its group

    def add_module(self, node: torch.fx.Node) -> None:
        """A ``call_module`` node: its unassigned parameters start a group, or join the writer's group for a
        normalization applied directly to a writer's output."""
        mod = self.gm.get_submodule(node.target)
        keys = [f"{node.target}.{n}" for n, _ in mod.named_parameters()]
        keys = [k for k in keys if k in self.pset and k not in self.assigned]
        if not keys:
            return
        src = node.args[0] if node.args else None
        if isinstance(mod, NORM_TYPES) and isinstance(src, torch.fx.Node) and src in self.writer_group:
            self.groups[self.writer_group[src]].extend(keys)
        else:
            self.groups.append(keys)
            if not isinstance(mod, NORM_TYPES):
                self.writer_group[node] = len(self.groups) - 1
        self.assigned.update(keys)

    def add_attr(self, node: torch.fx.Node) -> None:
        """A ``get_attr`` node: an unassigned parameter read directly is a group of its own."""
        if node.target in self.pset and node.target not in self.assigned:
            self.groups.append([node.target])
            self.assigned.add(node.target)

    def close(self) -> list[list[str]]:
        """The groups, with the parameters the graph never reached as the last one."""
        rest = [k for k in self.params if k not in self.assigned]
        if rest:
            self.groups.append(rest)
        return self.groups


def _merge_groups(groups: list[list[str]], owners: Mapping[str, str], level: int) -> list[list[str]]:
    """Consecutive groups whose first parameter's owning module shares the first ``level`` name components,
    merged (:func:`fdf_groups` with ``level``)."""
    merged: list[list[str]] = []
    last = None
    for g in groups:
        prefix = ".".join(owners.get(g[0], g[0]).split(".")[:level])
        if merged and prefix == last:
            merged[-1].extend(g)
        else:
            merged.append(list(g))
        last = prefix
    return merged


def resolve_groups(model: nn.Module, order: str | Sequence[Sequence[str]],
                   level: int | None = None) -> tuple[str, list[list[str]]]:
    """``(order name, groups)`` of an LLPF ``order``: ``"fdf"``, ``"all"`` or explicit groups (checked to cover
    every parameter exactly once; ConfigError naming the problem)."""
    params = param_names(model)
    if isinstance(order, str):
        if order not in ORDERS:
            raise ConfigError(f"unknown order {order!r}; valid: {', '.join(ORDERS)} or explicit groups of "
                              "parameter names (e.g. fdf_groups(model, level=2))")
        return order, (fdf_groups(model, level) if order == "fdf" else [params])
    groups = [list(g) for g in order]
    seen: dict[str, int] = {}
    for i, g in enumerate(groups):
        if not g:
            raise ConfigError(f"order: group {i} is empty")
        for k in g:
            if k not in params:
                raise ConfigError(f"order: group {i} names {k!r}, which is not a parameter of the model")
            if k in seen:
                raise ConfigError(f"order: parameter {k!r} is in groups {seen[k]} and {i}")
            seen[k] = i
    missing = [k for k in params if k not in seen]
    if missing:
        raise ConfigError(f"order: the groups must cover every parameter; missing: {', '.join(missing)}")
    return "explicit", groups
