"""REPAIR's contract checked from outside: after ``merge(..., bn="repair")`` every repair point of the merged model
carries the interpolated channel statistics of the endpoints (μ_t = ½(μ_A + μ_B), σ_t = ½(σ_A + σ_B))."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import modeconn as mc
from modeconn.path.repair import channel_stats, interpolated_targets


def trained_like_norms(model: nn.Module) -> nn.Module:
    """Give every BatchNorm layer (subclasses included) statistics and an affine a trained model might have: random
    means, variances in [0.5, 2], scales in [0.5, 1.5], shifts ~ N(0, 1). Returns ``model`` in eval mode."""
    with torch.no_grad():
        for bn in model.modules():
            if isinstance(bn, nn.modules.batchnorm._BatchNorm):
                bn.running_mean.normal_()
                bn.running_var.uniform_(0.5, 2.0)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.normal_()
    return model.eval()


def assert_repaired(make: Callable[[int], nn.Module], spec, shape: tuple[int, ...], classes: int) -> tuple[nn.Module, dict]:
    """Merge ``make(0)`` with weight-matched ``make(1)`` under REPAIR on random inputs of ``(96, *shape)``; assert the
    targets are met at ``spec.repair_points``; returns (merged model, targets) for further checks."""
    a, b = make(0), make(1)
    loader = DataLoader(TensorDataset(torch.randn(96, *shape), torch.randint(0, classes, (96,))), batch_size=32)
    sd_b = spec.apply(b.state_dict(), mc.weight_matching(spec, a.state_dict(), b.state_dict()).element)
    merged = mc.merge([a.state_dict(), sd_b], model=a, bn="repair", bn_loader=loader, spec=spec)
    batches = [xb for xb, _ in loader]
    b.load_state_dict(sd_b)
    targets = interpolated_targets([channel_stats(m, spec.repair_points, batches) for m in (a, b)], [0.5, 0.5])
    m = make(0)
    m.load_state_dict(merged)
    got = channel_stats(m, spec.repair_points, batches)
    for name, (mean_t, std_t) in targets.items():
        torch.testing.assert_close(got[name][0], mean_t, atol=2e-3, rtol=1e-3)
        torch.testing.assert_close(got[name][1], std_t, atol=2e-3, rtol=1e-3)
    return m, {"targets": targets, "batches": batches}
