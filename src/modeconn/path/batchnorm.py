"""BatchNorm running statistics along a path (the ``bn=`` policies).

Interpolated weights with stale running statistics compute nonsense (Jordan et al. 2023, REPAIR: an
aligned BN-ResNet20 midpoint at 13% accuracy before and 96% after recomputing them). ``reset`` re-
estimates them over a fixed list of training batches in one train-mode pass (stock BatchNorm layers normalise
each batch by its own statistics, as in training) — never with momentum 0, which would keep the reset values.

The re-estimated statistics are *per-sample* averages over the whole BN set, not averages of per-batch
statistics: for every BatchNorm layer and channel, over all ``N`` values it received in the pass (samples ×
spatial positions, every batch weighted by its size, so a short last batch counts for what it holds),
``running_mean = mean`` and ``running_var = Σ (x − mean)² / (N − 1)`` (the unbiased variance, PyTorch's
running-variance convention) — what ``momentum=None`` would store had the whole set been one batch. Per-batch
moments are combined exactly (Chan et al.'s pairwise update, float64). A batch of one sample (a set of size
≡ 1 mod the batch size) is joined to its neighbour, since train-mode BatchNorm cannot normalise one value
per channel.

:func:`check_bn_statistics` refuses statistics that would make an eval-mode BatchNorm output NaN (negative or
non-finite ``running_var``, non-finite ``running_mean``), e.g. from extrapolating weights with ``bn="interpolate"``.
"""

from __future__ import annotations

from contextlib import contextmanager
from collections.abc import Iterable, Mapping

import torch
import torch.nn as nn

from ..errors import ConfigError, NonFiniteError
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


class Moments:
    """Per-channel count, mean and sum of squared deviations of everything :meth:`add` saw (float64), combined
    batch by batch with Chan et al.'s exact pairwise update: the result equals the moments of all values at once."""

    def __init__(self) -> None:
        self.n = 0
        self.mean: torch.Tensor | None = None
        self.m2: torch.Tensor | None = None

    def add(self, x: torch.Tensor) -> None:
        """Accumulate ``x`` of shape ``(N, C, *)``: channel ``c`` gets the ``N·∏*`` values ``x[:, c, ...]``."""
        n = x.numel() // x.shape[1] if x.dim() > 1 else 0
        if n == 0:
            return
        x = x.detach().to(torch.promote_types(x.dtype, torch.float32))
        var, mean = torch.var_mean(x, dim=[0, *range(2, x.dim())], correction=0)
        mean, m2 = mean.double(), var.double() * n
        if self.mean is None:
            self.n, self.mean, self.m2 = n, mean, m2
            return
        total = self.n + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta.square() * (self.n * n / total)
        self.n = total

    def var(self) -> torch.Tensor:
        """The unbiased per-channel variance ``m2 / (n − 1)``; ConfigError with fewer than two values."""
        if self.n < 2:
            raise ConfigError(f"a variance needs at least two values per channel, got {self.n}")
        return self.m2 / (self.n - 1)


@contextmanager
def pooled_statistics(layers: Mapping[str, nn.Module]):
    """Inside: the input of every BatchNorm layer in ``layers`` (``{name: module}``) is accumulated per channel;
    on a normal exit each layer that received input gets ``running_mean``/``running_var`` = the per-sample mean
    and unbiased variance over everything it received (see the module docstring; the layers' own per-batch
    updates are replaced). A train-mode forward with one value per channel raises ConfigError naming the layer."""
    moments = {name: Moments() for name in layers}

    def watch(name: str):
        def pre_hook(module, args):
            x = args[0]
            if module.training and x.dim() > 1 and x.numel() // x.shape[1] < 2:
                raise ConfigError(f"BatchNorm {name!r} received one value per channel (input shape {tuple(x.shape)}): "
                                  "its statistics need at least two samples (or spatial positions) in the BN set")
            moments[name].add(x)

        return pre_hook

    handles = [m.register_forward_pre_hook(watch(name)) for name, m in layers.items()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
    for name, m in layers.items():
        if moments[name].n:
            m.running_mean.copy_(moments[name].mean.to(m.running_mean.dtype))
            m.running_var.copy_(moments[name].var().to(m.running_var.dtype))


def bn_batches(batches: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """``batches`` with every batch of one sample joined to the batch before it (the first to the one after),
    empty batches dropped; the samples and their order are unchanged."""
    out: list[torch.Tensor] = []
    pending: torch.Tensor | None = None
    for x in batches:
        if len(x) == 0:
            continue
        if pending is not None:
            x, pending = torch.cat([pending, x.to(pending.device)]), None
        if len(x) > 1:
            out.append(x)
        elif out:
            out[-1] = torch.cat([out[-1], x.to(out[-1].device)])
        else:
            pending = x
    return out + ([pending] if pending is not None else [])


@contextmanager
def recalibrating(model: nn.Module):
    """Inside: every BatchNorm of ``model`` has reset statistics, ``momentum=None`` and is in train mode while
    the rest of the model is in eval mode (no dropout); their inputs are pooled (:func:`pooled_statistics`), so
    on exit each holds the per-sample mean/unbiased variance of everything it saw. Momenta and training flags
    are restored on exit; the new statistics stay."""
    bns = batchnorm_modules(model)
    named = {id(m): n for n, m in model.named_modules()}
    momenta = [m.momentum for m in bns]
    try:
        for m in bns:
            m.reset_running_stats()
            m.momentum = None
        with eval_mode(model), torch.no_grad(), pooled_statistics({named[id(m)]: m for m in bns}):
            for m in bns:
                m.train()
            yield
    finally:
        for m, mom in zip(bns, momenta, strict=False):
            m.momentum = mom


def reset_bn_stats(model: nn.Module, batches: Iterable[torch.Tensor]) -> None:
    """Recompute every BatchNorm's running mean/var of ``model`` *in place* from one train-mode pass over
    ``batches`` (inputs ``(B, ...)``): per layer and channel, the mean and the unbiased variance over *all*
    values the layer received, each sample weighing the same whatever its batch's size (module docstring); a
    batch of one sample is joined to its neighbour (:func:`bn_batches`), ``num_batches_tracked`` counts the
    batches run. Only call it on a model you own (evaluate_path and merge work on a private copy).
    Raises ConfigError when a layer gets fewer than two values per channel in all."""
    if not batchnorm_modules(model):
        return
    device = model_device(model)
    with recalibrating(model):
        for x in bn_batches(batches):
            model(x.to(device))


def check_bn_statistics(model: nn.Module, what: str) -> None:
    """NonFiniteError naming ``what`` (e.g. ``"merged model"``, ``"θ(λ=0.5)"``) and the first BatchNorm buffer
    whose statistics would make the eval-mode output NaN/Inf or wrong: a ``running_mean`` with NaN/Inf entries, a
    ``running_var`` with negative or NaN/Inf entries."""
    bns = {id(m) for m in batchnorm_modules(model)}
    for name, m in model.named_modules():
        if id(m) in bns and m.running_var is not None:
            _check_buffer(f"{name}.running_mean", m.running_mean, what, negative_ok=True)
            _check_buffer(f"{name}.running_var", m.running_var, what, negative_ok=False)


def _check_buffer(key: str, t: torch.Tensor, what: str, negative_ok: bool) -> None:
    bad = ~torch.isfinite(t) if negative_ok else ~torch.isfinite(t) | (t < 0)
    if bool(bad.any()):
        kind = "NaN/Inf" if negative_ok else "negative or NaN/Inf"
        raise NonFiniteError(
            f"{what}: BatchNorm statistic {key!r} has {int(bad.sum())} {kind} entries (e.g. {float(t[bad][0]):.4g}): "
            "invalid statistics (extrapolating merge weights with bn='interpolate'/'keep' can produce them); "
            "re-estimate them with bn='reset'"
        )
