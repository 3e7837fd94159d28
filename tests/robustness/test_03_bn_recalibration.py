"""Class 3 — interpolation evaluated with stale BatchNorm statistics; recalibration with momentum 0.

An interpolated network with the endpoints' (or interpolated) running statistics computes nonsense, so interior
points of a path and merged models get their statistics re-estimated (``bn="reset"``, the default). The reset is the
*per-sample average over the whole BN set* (mean and unbiased variance of every value each layer received, batches
weighted by their size; see issue #14 class 11): momentum 0 would keep the reset values (mean 0, var 1) and an EMA
would over-weight the last batches. The semantics are pinned to a hand-computed average.
"""

from __future__ import annotations

import copy
import inspect
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from archs import make
from rb_helpers import batches
from torch import nn

import modeconn as mc
from modeconn.errors import ConfigError
from modeconn.nn_utils import batchnorm_modules, eval_mode
from modeconn.path import batchnorm as bn_mod
from modeconn.path import evaluate as evaluate_mod
from modeconn.path import evaluate_model, reset_bn_stats


def _two_bn_convnet() -> nn.Sequential:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4, momentum=0.3), nn.ReLU(), nn.Conv2d(4, 3, 1),
                        nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 3 * 3, 2))
    with torch.no_grad():
        for m in (net[1], net[4]):  # stale statistics that a correct reset must forget
            m.running_mean.fill_(5.0)
            m.running_var.fill_(9.0)
            m.num_batches_tracked.fill_(123)
    return net.eval()


def _hand_cumulative(net: nn.Sequential, xs: list[torch.Tensor]):
    """Per BN: mean and unbiased variance over all Σ_b N_b·H·W values it receives (BN in train mode)."""
    stats = {1: [], 4: []}
    with torch.no_grad():
        for x in xs:
            h = x
            for i, layer in enumerate(net):
                if i in stats:
                    stats[i].append(h.transpose(0, 1).reshape(h.shape[1], -1))
                    h = F.batch_norm(h, None, None, layer.weight, layer.bias, training=True, eps=layer.eps)
                else:
                    h = layer(h)
    return {i: (torch.cat(v, 1).mean(1), torch.cat(v, 1).var(1, unbiased=True)) for i, v in stats.items()}


def check_reset_semantics(net: nn.Sequential, xs: list[torch.Tensor]) -> None:
    """The check of this class: reset_bn_stats = hand-computed cumulative average; momenta/flags restored."""
    expected = _hand_cumulative(net, xs)
    reset_bn_stats(net, xs)
    for i, (mean, var) in expected.items():
        torch.testing.assert_close(net[i].running_mean, mean, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(net[i].running_var, var, atol=1e-5, rtol=1e-5)
        assert int(net[i].num_batches_tracked) == len(xs)
    assert (net[1].momentum, net[4].momentum) == (0.3, 0.1), "momenta restored"
    assert not any(m.training for m in net.modules()), "training flags restored"


def _xs():
    g = torch.Generator().manual_seed(1)
    return [3 + 2 * torch.randn(n, 2, 5, 5, generator=g) for n in (5, 11, 8)]  # unequal sizes


def test_reset_is_the_cumulative_average():
    check_reset_semantics(_two_bn_convnet(), _xs())


def _recalibrating_with(momentum, reset: bool = True):
    @contextmanager
    def broken(model):
        bns = batchnorm_modules(model)
        momenta = [m.momentum for m in bns]
        try:
            for m in bns:
                if reset:
                    m.reset_running_stats()
                m.momentum = momentum
            with eval_mode(model), torch.no_grad():
                for m in bns:
                    m.train()
                yield
        finally:
            for m, mom in zip(bns, momenta, strict=False):
                m.momentum = mom

    return broken


@pytest.mark.parametrize(
    "momentum, reset", [(0.0, True), (0.1, True), (None, False)], ids=["momentum-0", "ema-0.1", "no-reset"],
)
def test_negative_control_wrong_recalibration_is_caught(monkeypatch, momentum, reset):
    monkeypatch.setattr(bn_mod, "recalibrating", _recalibrating_with(momentum, reset))
    with pytest.raises(AssertionError):
        check_reset_semantics(_two_bn_convnet(), _xs())


def check_interior_points_recalibrated(a: nn.Module, b: nn.Module, loader, lam: float = 0.5) -> None:
    """The path check: the interior point of evaluate_path (default bn) equals interpolate → load → reset
    statistics on the same batches → evaluate, and differs from the stale-statistics evaluation."""
    sa, sb = a.state_dict(), b.state_dict()
    curve = mc.evaluate_path(a, sa, sb, loader, lambdas=[0.0, lam, 1.0], bn_loader=loader, bn_batches=2)
    ref_model = copy.deepcopy(a)
    ref_model.load_state_dict(mc.interpolate(sa, sb, lam))
    stale = evaluate_model(ref_model, loader)["loss"]
    reset_bn_stats(ref_model, [x for x, _ in loader[:2]])
    fresh = evaluate_model(ref_model, loader)["loss"]
    assert abs(fresh - stale) > 1e-3, "test setup: stale and fresh statistics must differ"
    assert curve.values()[1] == pytest.approx(fresh, rel=1e-6, abs=1e-7), (curve.values()[1], fresh, stale)
    merged = mc.merge([sa, sb], [1 - lam, lam], model=a, bn_loader=loader, bn_batches=2)
    for k, t in ref_model.state_dict().items():
        torch.testing.assert_close(merged[k], t, atol=1e-6, rtol=1e-6, msg=k)


def test_interior_points_and_merges_use_fresh_statistics():
    a, x = make("vgg-bn", seed=0)
    b, _ = make("vgg-bn", seed=1)
    check_interior_points_recalibrated(a, b, batches(x.shape[1:]))


def test_negative_control_stale_statistics_are_caught(monkeypatch):
    a, x = make("vgg-bn", seed=0)
    b, _ = make("vgg-bn", seed=1)

    def stale_load(self, sd, endpoint, targets=None):  # broken: loads θ(λ) without re-estimating statistics
        self.model.load_state_dict(sd)
        return self.model

    monkeypatch.setattr(evaluate_mod._Workbench, "load", stale_load)
    with pytest.raises(AssertionError):
        check_interior_points_recalibrated(a, b, batches(x.shape[1:]))


def test_reset_is_the_default_and_cannot_silently_fall_back():
    for fn in (mc.evaluate_path, mc.merge):
        assert inspect.signature(fn).parameters["bn"].default == "reset", fn.__name__
    a, x = make("mlp-bn", seed=0)
    b, _ = make("mlp-bn", seed=1)
    loader = batches(x.shape[1:], n=1)
    with pytest.raises(ConfigError, match="bn_loader"):
        mc.evaluate_path(a, a.state_dict(), b.state_dict(), loader, lambdas=3)
    with pytest.raises(ConfigError, match="bn_loader"):
        mc.merge([a.state_dict(), b.state_dict()], model=a)
