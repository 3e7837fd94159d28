"""Activation matching between models of different widths: a partial assignment per space.

For every permutation space the Pearson cross-correlation between A's ``n_a`` units and B's ``n_b`` units is
accumulated over a data loader (as in :mod:`.activation`, summed over the space's probes); a rectangular LAP
(``scipy.optimize.linear_sum_assignment``) pairs each unit of the smaller side with one of the larger, and the
``k`` pairs of highest correlation are kept, in the order of A's units. Keeping the pairs, both models are reduced to
``k`` units by :func:`modeconn.symmetry.select.select_units` and can then be averaged unit by unit: the transport
step of OT fusion (Singh & Jaggi 2020, "Model Fusion via Optimal Transport", with a hard one-to-one plan) and the
partial matching of ZipIt! (Stoica et al. 2024) restricted to A–B pairs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from ..errors import ConfigError, SpecError
from ..nn_utils import model_device
from ..symmetry import SymmetrySpec
from .activation import CorrelationStats, paired_probe_activations

__all__ = ["WidthAlignment", "partial_assignment", "unit_correlations", "width_matching"]


@dataclass(frozen=True)
class WidthAlignment:
    """Per space, the units of A (``select_a``) and of B (``select_b``) paired with each other: LongTensors of the
    target width ``k``; ``select_b[i]`` is B's partner of A's unit ``select_a[i]``. ``correlation``: per space the mean
    correlation of the kept pairs."""

    select_a: dict[str, torch.Tensor]
    select_b: dict[str, torch.Tensor]
    correlation: dict[str, float]


def unit_correlations(spec_a: SymmetrySpec, spec_b: SymmetrySpec, model_a: nn.Module, model_b: nn.Module,
                      loader: Iterable, max_batches: int | None = None) -> dict[str, torch.Tensor]:
    """Per space, the (n_a, n_b) Pearson correlation of A's units with B's over ``loader`` (each probe position a
    sample; summed over the space's probes; 0 for a constant unit, but 1 for two units constant at one value).
    Eval mode, no grad; the models are not modified.

    Raises: SpecError if the specs' spaces or probes differ by name; ConfigError for an empty loader.
    """
    if list(spec_a.spaces) != list(spec_b.spaces) or dict(spec_a.probes).keys() != dict(spec_b.probes).keys():
        raise SpecError("models A and B have different symmetry spaces: not one architecture at two widths")
    device = model_device(model_a)
    stats = {(s, i): CorrelationStats(spec_a.spaces[s].size, device, spec_b.spaces[s].size)
             for s, ps in spec_a.probes.items() for i in range(len(ps))}
    batches = 0
    for pairs in paired_probe_activations(spec_a, model_a, model_b, loader, max_batches, spec_b=spec_b):
        for key, (a, b) in pairs.items():
            stats[key].update(a, b)
        batches += 1
    if batches == 0:
        raise ConfigError("unit_correlations got an empty loader")
    return {s: sum(_score(stats[(s, i)]) for i in range(len(ps))) for s, ps in spec_a.probes.items()}


def _score(stats: CorrelationStats) -> torch.Tensor:
    """The correlation, and 1 for two units constant at one value (dead ReLUs): without it such a unit would pair
    with an arbitrary unit of the other model, one that is not constant on the data."""
    return stats.correlation().masked_fill(stats.equal_constants(), 1.0)


def partial_assignment(corr: torch.Tensor, k: int, space: str = "space") -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` pairs ``(rows, cols)`` (LongTensors (k,), ``rows`` ascending) of a maximum-correlation one-to-one
    matching between the rows and columns of ``corr`` (n_a, n_b): a rectangular LAP, then its ``k`` best pairs.

    Raises: ConfigError naming ``space`` if ``k`` exceeds ``min(n_a, n_b)`` (a width fusion cannot widen) or is < 1.
    """
    if not 1 <= k <= min(corr.shape):
        raise ConfigError(f"space {space!r}: cannot fuse {corr.shape[0]} and {corr.shape[1]} units into {k} "
                          f"(at most {min(corr.shape)}, the narrower model's width)")
    rows, cols = linear_sum_assignment(corr.double().cpu().numpy(), maximize=True)
    rows, cols = torch.as_tensor(rows, dtype=torch.long), torch.as_tensor(cols, dtype=torch.long)
    keep = torch.argsort(corr.double().cpu()[rows, cols], descending=True, stable=True)[:k].sort().values
    return rows[keep], cols[keep]


def width_matching(spec_a: SymmetrySpec, spec_b: SymmetrySpec, model_a: nn.Module, model_b: nn.Module,
                   loader: Iterable, widths: Mapping[str, int], *, max_batches: int | None = None) -> WidthAlignment:
    """Pair A's and B's units space by space on ``loader`` and keep ``widths[space]`` pairs per space.

    Args:
        spec_a, spec_b: traced specs (:func:`modeconn.symmetry_spec`) of one architecture at two widths (same space
            names, sizes ``n_a``, ``n_b``).
        widths: target units per space (``k ≤ min(n_a, n_b)``); every space of the spec must be named.
    Raises: SpecError (different spaces), ConfigError (a space missing from ``widths``, ``k`` out of range,
        an empty loader).
    """
    missing = [s for s in spec_a.spaces if s not in widths]
    if missing:
        raise ConfigError(f"no target width for spaces {missing}")
    corr = unit_correlations(spec_a, spec_b, model_a, model_b, loader, max_batches)
    select_a, select_b, mean = {}, {}, {}
    for s, c in corr.items():
        select_a[s], select_b[s] = partial_assignment(c, widths[s], s)
        mean[s] = float(c[select_a[s], select_b[s]].mean()) / len(spec_a.probes[s])
    return WidthAlignment(select_a, select_b, mean)
