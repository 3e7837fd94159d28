"""BatchNorm running statistics along a path (the ``bn=`` policies).

Interpolated weights with stale running statistics compute nonsense (Jordan et al. 2023, REPAIR: an
aligned BN-ResNet20 midpoint at 13% accuracy before and 96% after recomputing them). ``reset`` re-
estimates them as a *cumulative average* (``momentum=None``) over a fixed list of training batches in one
train-mode pass — never with momentum 0, which would keep the reset values.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable

import torch
import torch.nn as nn

from ..errors import ConfigError
from ..nn_utils import batch_inputs, batchnorm_modules, eval_mode, model_device

BN_POLICIES = ("reset", "interpolate", "keep", "repair")


def check_bn_policy(bn: str) -> None:
    if bn not in BN_POLICIES:
        raise ConfigError(f"unknown bn policy {bn!r}; valid: {', '.join(BN_POLICIES)}")


def fixed_batches(loader: Iterable, max_batches: int | None) -> list[torch.Tensor]:
    """The model inputs of the first ``max_batches`` batches (all when None), materialised once so every
    point of a path sees exactly the same batches."""
    out = []
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        out.append(batch_inputs(batch))
    if not out:
        raise ConfigError("the BatchNorm loader yielded no batches")
    return out


@contextmanager
def recalibrating(model: nn.Module):
    """Inside: every BatchNorm of ``model`` has reset statistics, ``momentum=None`` (cumulative average)
    and is in train mode while the rest of the model is in eval mode (no dropout). Momenta and training
    flags are restored on exit; the new statistics stay."""
    bns = batchnorm_modules(model)
    momenta = [m.momentum for m in bns]
    try:
        for m in bns:
            m.reset_running_stats()
            m.momentum = None
        with eval_mode(model), torch.no_grad():
            for m in bns:
                m.train()
            yield
    finally:
        for m, mom in zip(bns, momenta):
            m.momentum = mom


def reset_bn_stats(model: nn.Module, batches: Iterable[torch.Tensor]) -> None:
    """Recompute every BatchNorm's running mean/var of ``model`` *in place* as the cumulative average of
    per-batch statistics over ``batches`` (``running_mean = mean_b μ_b``, ``running_var = mean_b σ²_b``
    with unbiased σ²_b: PyTorch's ``momentum=None`` semantics). Only call it on a model you own
    (evaluate_path and merge work on a private copy)."""
    if not batchnorm_modules(model):
        return
    device = model_device(model)
    with recalibrating(model):
        for x in batches:
            model(x.to(device))
