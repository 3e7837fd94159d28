"""Pair diagnostics of ``modeconn check``: how two models relate, without evaluating any interpolation path.

* Activation statistics per space (:func:`space_statistics`): the Pearson cross-correlation ``corr[i, j]`` of A's
  unit ``i`` with B's unit ``j`` over the space's probes (as activation matching accumulates it), the identity /
  optimal activation-matching ratio (:func:`modeconn.identifiability.identity_vs_optimal`), the mean unit
  correlation ``q(π) = (1/n) Σ_i corr[i, π(i)]`` under the identity, under weight matching's and under the optimal
  permutation, and linear CKA (Kornblith et al. 2019, eq. 5: ``‖XᵀY‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F)`` on centred
  activations; invariant to orthogonal transforms and isotropic scaling of either side, so a high CKA with a low
  optimal ``q`` means the representations agree only up to a continuous transform).
* Per-layer weight cosine (:func:`weight_cosines`): ``⟨θ_A, θ_B⟩ / (‖θ_A‖ ‖θ_B‖)`` of every bound weight tensor
  (≥ 2 dimensions) at the identity and after weight matching.

A unit constant on the data (a dead ReLU) correlates with no unit: its correlations count as 0 (the convention the
predictor was calibrated with). A statistic that has nothing left to compute from (a space where every unit of one
model is constant on the data, an all-zero weight tensor, activations without variance, an optimal objective ≤ 0
under a ratio) is ``None``, and the entry's ``undefined`` names the statistic and why — never a 0 or NaN standing in
for a number that does not exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
from ..identifiability import identity_vs_optimal
from ..match.activation import CorrelationStats, paired_probe_activations
from ..nn_utils import model_device
from ..symmetry import SymmetrySpec

CKA_ROWS = 4096
"""At most this many samples (rows) per probe enter linear CKA (conv probes give N·H·W rows per batch)."""


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA of two ``(samples, n)`` / ``(samples, m)`` activation matrices (Kornblith et al. 2019, eq. 5).

    Columns are centred; returns a float in ``[0, 1]``, or None when either side has no variance (CKA is 0/0 then).
    Raises ConfigError when the sample counts differ or fewer than 2 samples are given.
    """
    if x.shape[0] != y.shape[0] or x.shape[0] < 2:
        raise ConfigError(f"linear_cka needs the same number (≥ 2) of samples on both sides, got {tuple(x.shape)} "
                          f"and {tuple(y.shape)}")
    x = x.double() - x.double().mean(0)
    y = y.double() - y.double().mean(0)
    den = torch.linalg.matrix_norm(x.T @ x) * torch.linalg.matrix_norm(y.T @ y)
    return float((torch.linalg.matrix_norm(x.T @ y) ** 2 / den).clamp(0, 1)) if den > 0 else None


def _rows(x: torch.Tensor, want: int, gen: torch.Generator) -> torch.Tensor:
    if x.shape[0] <= want:
        return x
    return x[torch.randperm(x.shape[0], generator=gen)[:want].to(x.device)]


def collect(spec: SymmetrySpec, model_a: nn.Module, model_b: nn.Module, loader: Iterable, max_batches: int,
            seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, torch.Tensor]], int,
                                    dict[str, str]]:
    """One pass of both models over ``loader`` (at most ``max_batches`` batches, eval mode, no grad).

    Returns ``(corr, samples, batches, constant)``: ``corr[space]`` the ``(n, n)`` Pearson correlation summed over
    the space's probes; ``samples[space]`` a pair of ``(rows, n)`` float64 activation samples of A and B at the
    space's first probe (at most :data:`CKA_ROWS` rows, the same rows on both sides); the number of batches seen;
    ``constant[space]``: why, for the spaces where at some probe every unit of A or of B is constant on the data
    (every correlation 0/0).
    Raises ConfigError for an empty loader, SpecError for a space without probes.
    """
    from ..errors import SpecError

    missing = [s for s in spec.spaces if not spec.probes.get(s)]
    if missing:
        raise SpecError(f"spaces {missing} have no activation probes; build the spec with modeconn.symmetry_spec(model, x)")
    device = model_device(model_a)
    stats = {(s, i): CorrelationStats(spec.spaces[s].size, device) for s in spec.spaces for i in range(len(spec.probes[s]))}
    keep: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {s: [] for s in spec.spaces}
    gen = torch.Generator().manual_seed(seed)
    batches = 0
    for pairs in paired_probe_activations(spec, model_a, model_b, loader, max_batches):
        for (s, i), (xa, xb) in pairs.items():
            stats[(s, i)].update(xa, xb)
            if i == 0:
                idx = _rows(torch.arange(xa.shape[0]), CKA_ROWS // max_batches + 1, gen)
                keep[s].append((xa[idx.to(xa.device)].double().cpu(), xb[idx.to(xb.device)].double().cpu()))
        batches += 1
    if batches == 0:
        raise ConfigError("check got an empty data loader")
    corr = {s: sum(stats[(s, i)].correlation() for i in range(len(spec.probes[s]))) / len(spec.probes[s])
            for s in spec.spaces}
    samples = {s: (torch.cat([a for a, _ in v]), torch.cat([b for _, b in v])) for s, v in keep.items()}
    constant: dict[str, str] = {}
    for (s, i), st in stats.items():
        for side, dead in zip("AB", st.constant_units(), strict=True):
            if s not in constant and bool(dead.all()):
                constant[s] = (f"all {dead.numel()} units of model {side} are constant on the data at "
                               f"{spec.probes[s][i].module!r} (every correlation is 0/0)")
    return corr, samples, batches, constant


def mean_correlation(corr: torch.Tensor, perm: torch.Tensor | None = None) -> float:
    """``q(π) = (1/n) Σ_i corr[i, π(i)]`` (``π`` = identity when ``perm`` is None)."""
    n = corr.shape[0]
    p = torch.arange(n) if perm is None else perm.to(torch.long).cpu()
    return float(corr.cpu()[torch.arange(n), p].mean())


SPACE_STATISTICS = ("identity_ratio", "q_identity", "q_weight", "q_optimal", "cka")
"""The per-space statistics of :func:`space_statistics` (each ``None`` where undefined)."""


def space_statistics(spec: SymmetrySpec, corr: Mapping[str, torch.Tensor],
                     samples: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
                     wm_element: Mapping[str, torch.Tensor] | None,
                     constant: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Per space: ``n``, ``identity_ratio`` (identity / optimal activation-matching objective), ``q_identity``,
    ``q_weight`` (under weight matching's permutation; None without one or for a non-permutation group),
    ``q_optimal`` (under the optimal permutation of ``corr``), ``cka`` (linear CKA of the sampled activations) and
    ``undefined`` (statistic → why it is None: every statistic of a space in ``constant``, :func:`collect`'s; the
    ratio when the optimal objective is ≤ 0; CKA without variance)."""
    out = {}
    for s, c in corr.items():
        if constant and s in constant:
            out[s] = {"n": int(c.shape[0]), **dict.fromkeys(SPACE_STATISTICS),
                      "undefined": dict.fromkeys(SPACE_STATISTICS, constant[s])}
            continue
        iv = identity_vs_optimal(c)
        wm = None if wm_element is None else wm_element.get(s)
        q_w = mean_correlation(c, wm) if wm is not None and wm.dim() == 1 else None
        xa, xb = samples[s]
        ratio = iv["ratio"] if iv["optimal"] > 0 else None  # ≤ 0: a quotient of correlations means nothing
        cka = linear_cka(xa, xb)
        undefined = {}
        if ratio is None:
            undefined["identity_ratio"] = (f"the optimal permutation's summed correlation is {iv['optimal']:.3g} ≤ 0 "
                                           "(identity / optimal is undefined)")
        if cka is None:
            undefined["cka"] = "the sampled activations of A or B have no variance (CKA is 0/0)"
        out[s] = {"n": int(c.shape[0]), "identity_ratio": ratio, "q_identity": mean_correlation(c), "q_weight": q_w,
                  "q_optimal": mean_correlation(c, iv["perm"]), "cka": cka, "undefined": undefined}
    return out


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """The cosine of two tensors; None when either is all zeros (0/0)."""
    a, b = a.double().flatten(), b.double().flatten()
    den = float(a.norm() * b.norm())
    return float(a @ b) / den if den > 0 else None


def weight_cosines(spec: SymmetrySpec, sd_a: Mapping[str, torch.Tensor], sd_b: Mapping[str, torch.Tensor],
                   sd_b_aligned: Mapping[str, torch.Tensor] | None) -> dict[str, dict[str, Any]]:
    """Per bound weight tensor (≥ 2 dimensions, in the spec's order; not the spec's buffers — fixed masks and
    offsets are no weights, and equal in two models of one structure): cosine of A and B at the identity and of A
    and weight-matched B (None without an alignment); where the tensor is all zeros in A or B both are None and
    ``undefined`` says why."""
    out: dict[str, dict[str, Any]] = {}
    for key in spec.tensors:
        if key not in sd_a or key in spec.buffers or sd_a[key].dim() < 2 or not sd_a[key].is_floating_point():
            continue
        zero = [m for m, sd in (("A", sd_a), ("B", sd_b)) if not bool(sd[key].detach().ne(0).any())]
        if zero:
            out[key] = {"identity": None, "weight_matched": None,
                        "undefined": f"the tensor is all zeros in model {' and '.join(zero)} (cosine 0/0)"}
            continue
        out[key] = {"identity": _cosine(sd_a[key], sd_b[key]),
                    "weight_matched": None if sd_b_aligned is None else _cosine(sd_a[key], sd_b_aligned[key])}
    return out
