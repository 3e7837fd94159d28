"""REPAIR (Jordan et al. 2023, "REPAIR: REnormalizing Permuted Activations for Interpolation Repair").

After averaging aligned models, each hidden channel's statistics collapse ("variance collapse"). REPAIR
rescales every channel of the merged network so its mean and standard deviation equal the interpolation
of the endpoints' (``μ_t = Σ w_i μ_i``, ``σ_t = Σ w_i σ_i``, Eq. 4 of the paper), measured on training
data, then folds the per-channel affine correction back into the layer (a Linear/Conv row or a norm's
affine), so the architecture is unchanged. Done with stock BatchNorm layers, as in the paper's code:
moment trackers measure statistics; "reset" layers with affine = (σ_t, μ_t) normalise the merged net in one
train-mode pass and are then folded.

Repair points come from the traced spec (``spec.repair_points``): each hidden writer (Linear/Conv), or
the norm layer directly after it.
"""

from __future__ import annotations

from contextlib import contextmanager
from collections.abc import Iterable, Mapping, Sequence

import torch
import torch.nn as nn

from ..errors import ConfigError
from ..nn_utils import eval_mode, model_device
from .batchnorm import Moments, bn_batches, pooled_statistics, recalibrating, reset_bn_stats

Points = Sequence[tuple[str, int] | tuple[str, int, str]]
"""``(module, channel dim)``: correct the module's output and fold into it; ``(module, dim, reader)``: correct the
*input* of the elementwise module ``reader`` (a norm computed inside ``module``'s forward before its activation,
timm's ``BatchNormAct2d``) and fold into ``module``'s affine."""


def _channels_first(x: torch.Tensor, dim: int) -> torch.Tensor:
    """(N, ..., C at dim, ...) → (N, C, L) for BatchNorm1d."""
    return x.movedim(dim, 1).reshape(x.shape[0], x.shape[dim], -1)


def _restore(z: torch.Tensor, like: torch.Tensor, dim: int) -> torch.Tensor:
    return z.reshape(like.movedim(dim, 1).shape).movedim(1, dim)


@contextmanager
def _hooks(model: nn.Module, points: Points, fn):
    modules = dict(model.named_modules())
    missing = [n for p in points for n in (p[0], *p[2:]) if n not in modules]
    if missing:
        raise ConfigError(f"REPAIR points {missing} not found in {type(model).__name__}")
    handles = []
    for n, d, *reader in points:
        if reader:
            def pre(m, args, _n=n, _d=d):
                out = fn(_n, _d, args[0])
                return None if out is None else (out, *args[1:])

            handles.append(modules[reader[0]].register_forward_pre_hook(pre))
        else:
            handles.append(modules[n].register_forward_hook(lambda m, a, out, _n=n, _d=d: fn(_n, _d, out)))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def channel_stats(model: nn.Module, points: Points, batches: Iterable[torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per-channel (mean, std) of each repair point's output over ``batches`` (model in eval mode): the mean and
    the square root of the unbiased variance over every sample (and position) of all batches, each sample
    weighing the same whatever its batch's size. Returns ``{module name: ((C,), (C,))}`` in the output's dtype."""
    moments: dict[str, Moments] = {}
    dtypes: dict[str, torch.dtype] = {}

    def track(name, dim, out):
        moments.setdefault(name, Moments()).add(_channels_first(out, dim))
        dtypes[name] = out.dtype

    device = model_device(model)
    with eval_mode(model), _hooks(model, points, track):
        for x in batches:
            model(x.to(device))
    return {n: (m.mean.to(dtypes[n]), m.var().clamp_min(0).sqrt().to(dtypes[n])) for n, m in moments.items()}


def interpolated_targets(
    stats: Sequence[Mapping[str, tuple[torch.Tensor, torch.Tensor]]], weights: Sequence[float]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``μ_t = Σ w_i μ_i``, ``σ_t = Σ w_i σ_i`` per repair point."""
    return {
        n: (sum(w * s[n][0] for w, s in zip(weights, stats, strict=False)), sum(w * s[n][1] for w, s in zip(weights, stats, strict=False)))
        for n in stats[0]
    }


@torch.no_grad()
def repair_model(model: nn.Module, targets: Mapping[str, tuple[torch.Tensor, torch.Tensor]], points: Points,
                 batches: Sequence[torch.Tensor]) -> None:
    """Correct ``model`` (a private copy holding the merged weights) *in place* so each repair point's
    channels have the target mean/std, folding the correction into the layer; BatchNorm running
    statistics are re-estimated afterwards. Statistics are per-sample over all ``batches`` (as
    :func:`~modeconn.path.batchnorm.reset_bn_stats`: batches weighted by size, a batch of one joined to its
    neighbour)."""
    resetters: dict[str, nn.BatchNorm1d] = {}
    for n, (mean_t, std_t) in targets.items():
        bn = nn.BatchNorm1d(len(mean_t), momentum=None, device=mean_t.device, dtype=mean_t.dtype)
        bn.weight.copy_(std_t)
        bn.bias.copy_(mean_t)
        resetters[n] = bn.train()

    def renormalise(name, dim, out):
        return _restore(resetters[name](_channels_first(out, dim)), out, dim)

    device = model_device(model)
    with recalibrating(model), pooled_statistics(resetters), _hooks(model, points, renormalise):
        for x in bn_batches(batches):
            model(x.to(device))
    modules = dict(model.named_modules())
    for n, bn in resetters.items():
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        shift = bn.bias - scale * bn.running_mean
        _fold(modules[n], n, scale, shift)
    reset_bn_stats(model, batches)


def _fold(module: nn.Module, name: str, scale: torch.Tensor, shift: torch.Tensor) -> None:
    """y ← scale·y + shift per output channel, folded into ``module``'s weight rows and bias."""
    if getattr(module, "fixed_buffers", None):
        raise ConfigError(f"REPAIR cannot fold into W-asymmetric layer {name!r}: its fixed offsets are not trainable; "
                          "use a norm layer after it or bn='reset'")
    w = module.weight
    w.mul_(scale.to(w.dtype).reshape(-1, *([1] * (w.dim() - 1))))
    if module.bias is None:
        if torch.allclose(shift, torch.zeros_like(shift), atol=1e-6):
            return
        raise ConfigError(f"REPAIR cannot fold a shift into {name!r}: it has no bias and no norm layer after it")
    module.bias.mul_(scale.to(w.dtype)).add_(shift.to(w.dtype))
