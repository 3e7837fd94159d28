"""The aligned path's midpoint, measured on ``check``'s evaluation examples: a direct small-sample measurement of the
barrier after alignment.

For an alignment ``g`` of B to A, ``θ(½) = (θ_A + g·θ_B) / 2`` is one point of the path ``modeconn barrier``
evaluates (its BatchNorm statistics re-estimated on training batches, the ``reset`` policy). The path's
``barrier_mean = max_λ L(λ) − (L_A + L_gB) / 2`` (test loss, nats per example — per token for sequence models)
taken over the grid ``λ ∈ {0, ½, 1}`` alone, ``m = max(L(½), L_A, L_gB) − (L_A + L_gB) / 2``, is a lower bound of the
full grid's and equals it where the path peaks at ½ or at an endpoint (two endpoints of unequal loss: ``m ≥ |L_A −
L_gB| / 2``). Its standard error over the evaluation examples is the ratio estimator's of the maximising point,
``se = sqrt(Σ_i (e_i − m c_i)²) / Σ_i c_i`` with ``e_i`` example i's summed loss at that point minus
``(ℓ_i(A) + ℓ_i(gB)) / 2`` and ``c_i`` its scored tokens (1 for a classifier).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..nn_utils import IGNORE_INDEX, batchnorm_modules, eval_mode, model_device


@torch.no_grad()
def example_losses(model: nn.Module, loader: Iterable) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, count)``: per example of ``loader`` (in order) the summed cross-entropy (nats, float64) and the
    number of scored targets — 1 for logits ``(B, K)`` with labels ``(B,)``; for sequence logits ``(B, T, V)`` with
    labels ``(B, T)`` the tokens not labelled ``IGNORE_INDEX``."""
    device = model_device(model)
    losses, counts = [], []
    with eval_mode(model):
        for x, y, *_ in loader:
            logits, y = model(x.to(device)), y.to(device)
            if logits.ndim == 3:
                loss = F.cross_entropy(logits.transpose(1, 2), y, reduction="none", ignore_index=IGNORE_INDEX)
                losses.append(loss.double().sum(1).cpu())
                counts.append((y != IGNORE_INDEX).sum(1).double().cpu())
            else:
                losses.append(F.cross_entropy(logits, y, reduction="none").double().cpu())
                counts.append(torch.ones(len(y), dtype=torch.float64))
    return torch.cat(losses), torch.cat(counts)


def _mean(loss: torch.Tensor, count: torch.Tensor) -> float:
    return float(loss.sum() / count.sum())


def aligned_midpoints(spec, model_a: nn.Module, sa: Mapping[str, torch.Tensor], sb: Mapping[str, torch.Tensor],
                      elements: Mapping[str, Any], test: Iterable, bn_loader: Iterable, bn_batches: int,
                      measure: Collection[str] | None = None) -> dict[str, dict[str, float | None]]:
    """Per alignment (``elements``: name → element of ``spec`` moving B to A, the identity included):
    ``moved_loss``, the test loss of B moved by it, ``midpoint_barrier`` ``m`` (the barrier over λ ∈ {0, ½, 1}) and
    ``midpoint_se`` its standard error (module docstring), on the examples of ``test``; BatchNorm statistics at the
    midpoint re-estimated on the first ``bn_batches`` batches of ``bn_loader``. Only the alignments named in
    ``measure`` (None: all) get a midpoint — not a permutation of a model with fixed asymmetric structure, where the
    moved B is not B —; the others' midpoint entries are None. The models and state dicts are never modified."""
    from ..path.batchnorm import fixed_batches, reset_bn_stats
    from ..path.interpolate import interpolate

    measure = set(elements if measure is None else measure)
    work = copy.deepcopy(model_a)
    batches = fixed_batches(bn_loader, bn_batches) if measure and batchnorm_modules(work) else []
    loss_a = example_losses(model_a, test)[0] if measure else None
    out: dict[str, dict[str, float | None]] = {}
    for name, g in elements.items():
        sd = spec.apply(sb, g)
        work.load_state_dict(sd)
        loss_b, count = example_losses(work, test)
        out[name] = {"moved_loss": _mean(loss_b, count), "midpoint_barrier": None, "midpoint_se": None}
        if name not in measure:
            continue
        work.load_state_dict(interpolate(sa, sd, 0.5))
        reset_bn_stats(work, batches)
        ends = 0.5 * (loss_a + loss_b)
        excess = max((example_losses(work, test)[0] - ends, loss_a - ends, loss_b - ends),
                     key=lambda e: _mean(e, count))
        m = _mean(excess, count)
        out[name].update(midpoint_barrier=m,
                         midpoint_se=math.sqrt(float(((excess - m * count) ** 2).sum())) / float(count.sum()))
    return out
