"""One-model diagnostics of ``modeconn check``: how strongly each layer's permutation symmetry is broken on the
data it sees (docs/methods.md §1), from model A alone.

For every Linear / Conv2d layer (``groups = 1``) whose output axis is a permutation space of the spec, with inputs
``X`` (the layer's actual inputs on the data; a convolution's as unfolded patches) and effective weights
``W_eff = F + D ⊙ W`` (``F = 0, D = 1`` for a standard layer):

* ``U``: PCA basis of ``X`` reaching :data:`EXPLAINED` of the variance (:func:`modeconn.identifiability.estimate_subspace`),
  ``k`` its dimension (the estimated intrinsic dimension; at most :data:`K_MAX` directions are used), ``ν(U)`` its
  coherence (:func:`~modeconn.identifiability.subspace_coherence`);
* ``C[i, j] = c_i(a_j)`` with ``a_j = Uᵀ w_eff,j`` (:func:`~modeconn.identifiability.realization_cost`) for a
  deterministic subset of at most :data:`NEURONS` neurons; the swap costs ``Δ`` of the identity
  (:func:`~modeconn.identifiability.swap_costs`), the exact assignment margin
  (:func:`~modeconn.identifiability.assignment_margin`), and ``relative_swap_cost = median Δ / median C[i, i]``
  (dimensionless; exactly 0 for a standard layer, where every neuron realises every feature at the same cost);
* the separation of the projected fixed centers ``b_i = Uᵀ f_i`` (:func:`~modeconn.identifiability.center_separation`)
  where ``F ≠ 0``.

A diagnostic that does not exist for a layer is ``None``, with ``undefined`` saying why: inputs constant on the data
(no subspace), a median self cost of 0 (every neuron realises its own feature for free: ``relative_swap_cost`` is
0/0), a single neuron (no swap).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as tnf
from torch import nn

from ..identifiability import assignment_margin, center_separation, estimate_subspace, realization_cost, subspace_coherence, swap_costs
from ..nn_utils import batch_inputs, eval_mode, model_device
from ..symmetry import SymmetrySpec

EXPLAINED = 0.9
"""Fraction of the input variance the PCA basis ``U`` of a layer must explain."""
K_MAX = 32
"""At most this many PCA directions enter the realization costs (the memory is ``O(m² k)``)."""
NEURONS = 64
"""At most this many neurons per layer enter the cost matrix (the exact margin solves ``m + 1`` LAPs)."""
ROWS = 4096
"""At most this many input rows per layer for the PCA."""
CONV_IMAGES = 32
"""A convolution's patches come from at most this many images per batch (each gives ``H·W`` patches)."""


def candidate_layers(model: nn.Module, spec: SymmetrySpec) -> dict[str, nn.Module]:
    """Linear / Conv2d (``groups = 1``) modules whose weight's output axis is bound to a permutation space."""
    out = {}
    for name, mod in model.named_modules():
        if not (isinstance(mod, nn.Linear) or (isinstance(mod, nn.Conv2d) and mod.groups == 1)):
            continue
        binds = spec.tensors.get(f"{name}.weight", ())
        if any(b.axis == 0 and b.side == "out" and spec.group_of(b.space).exact for b in binds):
            out[name] = mod
    return out


def _as_rows(mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if isinstance(mod, nn.Conv2d):
        x = x[:CONV_IMAGES]
        cols = tnf.unfold(x, mod.kernel_size, dilation=mod.dilation, padding=mod.padding, stride=mod.stride)
        return cols.transpose(1, 2).reshape(-1, cols.shape[1])
    return x.reshape(-1, x.shape[-1])


def layer_inputs(model: nn.Module, layers: dict[str, nn.Module], loader: Iterable, max_batches: int,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """``(rows, fan_in)`` float64 input samples of every layer (at most :data:`ROWS` rows each, CPU)."""
    store: dict[str, list[torch.Tensor]] = {n: [] for n in layers}
    gen = torch.Generator().manual_seed(seed)

    def hook(name: str, mod: nn.Module):
        def fn(_m, args):
            rows = _as_rows(mod, args[0].detach())
            pick = torch.randperm(rows.shape[0], generator=gen)[: ROWS // max_batches + 1]
            store[name].append(rows[pick.to(rows.device)].double().cpu())
        return fn

    handles = [m.register_forward_pre_hook(hook(n, m)) for n, m in layers.items()]
    device = model_device(model)
    try:
        with eval_mode(model), torch.no_grad():
            for i, batch in enumerate(loader):
                if i >= max_batches:
                    break
                model(batch_inputs(batch).to(device))
    finally:
        for h in handles:
            h.remove()
    return {n: torch.cat(v) for n, v in store.items() if v}


def _fixed(mod: nn.Module) -> tuple[torch.Tensor, torch.Tensor, bool]:
    w = mod.weight.detach().double().flatten(1)
    if hasattr(mod, "fixed_offsets") and hasattr(mod, "fixed_mask"):
        return mod.fixed_offsets.double().flatten(1), mod.fixed_mask.double().flatten(1), True
    return torch.zeros_like(w), torch.ones_like(w), False


_DIAGNOSTICS = ("k", "k_used", "coherence", "self_cost_median", "swap_cost_median", "swap_positive_fraction",
                "relative_swap_cost", "identity_optimal", "relative_margin", "center_nn_ratio", "center_mean_ratio")


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def layer_identifiability(mod: nn.Module, x: torch.Tensor, seed: int = 0) -> dict[str, Any]:
    """Realization-cost diagnostics of one layer on its inputs ``x`` ``(rows, fan_in)`` (module docstring);
    ``undefined``: None, or why ``relative_swap_cost`` (and what else is None) does not exist for this layer."""
    m = int(mod.weight.shape[0])
    f, d, asymmetric = _fixed(mod)
    if not bool((x != x[:1]).any()):  # all rows equal: zero variance, no input subspace
        return {"fan_in": int(x.shape[1]), "neurons": m, "neurons_used": 0, "asymmetric": asymmetric,
                **dict.fromkeys(_DIAGNOSTICS), "undefined": "the layer's inputs are constant on the data (zero "
                "variance: no input subspace, no realization costs)"}
    basis, _ = estimate_subspace(x, explained_variance=EXPLAINED)   # one SVD; principal directions in order
    k_est = int(basis.shape[1])
    U = basis[:, :K_MAX].contiguous()
    w_eff = f + d * mod.weight.detach().double().flatten(1)
    sub = torch.sort(torch.randperm(m, generator=torch.Generator().manual_seed(seed))[:NEURONS]).values
    C = realization_cost(U, f[sub], d[sub], w_eff[sub] @ U)
    delta = swap_costs(C)
    off = delta[~torch.eye(len(sub), dtype=torch.bool)]
    off = off[torch.isfinite(off)]
    selfc = C.diagonal()[torch.isfinite(C.diagonal())]
    scale = float(selfc.median()) if len(selfc) else float("nan")
    am = assignment_margin(C)
    has_f = asymmetric and bool(f.abs().max() > 0)
    sep = center_separation(U, f[sub]) if has_f else None
    undefined = None
    if not len(off):
        undefined = "a single neuron: no swap"
    elif not scale > 0:
        undefined = (f"the median finite self cost is {scale:.3g}, not > 0: the relative swap cost is 0/0 (the "
                     "neurons realise their own features for free)")
    return {
        "fan_in": int(x.shape[1]), "neurons": m, "neurons_used": len(sub), "asymmetric": asymmetric,
        "k": k_est, "k_used": int(U.shape[1]), "coherence": subspace_coherence(U),
        "self_cost_median": _finite(scale), "swap_cost_median": float(off.median()) if len(off) else None,
        "swap_positive_fraction": float((off > 0).double().mean()) if len(off) else None,
        "relative_swap_cost": None if undefined else float(off.median()) / scale,
        "identity_optimal": bool(torch.equal(am.perm, torch.arange(len(sub)))),
        "relative_margin": am.margin / (len(sub) * scale) if scale > 0 and am.margin != float("inf") else None,
        "center_nn_ratio": None if sep is None else _finite(sep["nn_mean_ratio"]),
        "center_mean_ratio": None if sep is None else _finite(sep["mean_ratio"]),
        "undefined": undefined,
    }


def model_identifiability(model: nn.Module, spec: SymmetrySpec, loader: Iterable, max_batches: int,
                          seed: int = 0) -> dict[str, dict[str, Any]]:
    """:func:`layer_identifiability` of every :func:`candidate_layers` layer, by module name."""
    layers = candidate_layers(model, spec)
    xs = layer_inputs(model, layers, loader, max_batches, seed)
    return {name: layer_identifiability(layers[name], xs[name], seed) for name in layers if name in xs}
