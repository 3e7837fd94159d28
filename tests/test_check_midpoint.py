"""``check``'s predictions after alignment read the aligned path's midpoint (:mod:`modeconn.diagnostics.midpoint`):
the midpoint barrier is the point λ = ½ of the path ``evaluate_path`` measures (BatchNorm statistics re-estimated),
a line whose feature is the midpoint reads it (an older line reads ``1 − q̄``), its standard error widens the
interval, and the intervals are split-conformal bounds that hold their level where sample quantiles fall short."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from modeconn import build_model
from modeconn.data import load_dataset, make_loader
from modeconn.diagnostics import LogLinear, check
from modeconn.diagnostics.check import MIDPOINT_FEATURES
from modeconn.diagnostics.midpoint import aligned_midpoints
from modeconn.diagnostics.predictor import Q_HI, Q_LO, conformal_bounds
from modeconn.match import weight_matching
from modeconn.path import evaluate_path
from modeconn.symmetry import symmetry_spec
from modeconn.train import TrainConfig, fit

pytestmark = pytest.mark.usefixtures("one_thread")


def _midpoint_of_path(a, sa, sd, test, train) -> float:
    v = evaluate_path(a, sa, sd, test, lambdas=(0.0, 0.5, 1.0), bn_loader=train, bn_batches=2).values(None, "loss")
    return float(v.max() - 0.5 * (v[0] + v[2]))


def test_midpoint_barrier_is_the_paths_point_at_one_half_with_batchnorm_reset(shared_data, monkeypatch):
    fm = load_dataset("fashion-mnist", shared_data, limit_train=200, limit_test=100)
    a, b = (build_model("resnet20", in_shape=(1, 28, 28), num_classes=10, width=0.5, seed=s).eval() for s in (0, 1))
    spec = symmetry_spec(a, fm.train.tensors[0][:2])
    sa, sb = a.state_dict(), b.state_dict()
    g = weight_matching(spec, sa, sb).element
    test, train = make_loader(fm.test, 50), make_loader(fm.train, 100)
    want = _midpoint_of_path(a, sa, spec.apply(sb, g), test, train)
    got = aligned_midpoints(spec, a, sa, sb, {"wm": g}, test, train, 2)["wm"]
    assert got["midpoint_barrier"] == pytest.approx(want, rel=1e-6, abs=1e-6) and got["midpoint_se"] > 0
    assert aligned_midpoints(spec, a, sa, sb, {"wm": g}, test, train, 2, measure=())["wm"]["midpoint_se"] is None
    monkeypatch.setattr("modeconn.path.batchnorm.reset_bn_stats", lambda model, batches: None)  # negative control
    stale = aligned_midpoints(spec, a, sa, sb, {"wm": g}, test, train, 2)["wm"]["midpoint_barrier"]
    assert abs(stale - want) > 0.05 * abs(want), (stale, want)


def test_a_midpoint_line_reads_the_measured_midpoint_and_an_older_line_the_unit_correlation(shared_data):
    digits = load_dataset("digits", shared_data)
    a, b = (build_model("mlp", in_shape=(1, 8, 8), num_classes=10, width=32, depth=2, seed=s) for s in (0, 1))
    for s, m in enumerate((a, b)):
        fit(m, digits.train, TrainConfig(epochs=2, seed=s), progress=False)
    mid = LogLinear(MIDPOINT_FEATURES["weight_matched"], 0.0, 1.0, -0.5, 0.5, 10)
    old = LogLinear("1 - mean unit correlation", 0.0, 1.0, -0.5, 0.5, 10)
    res = check(a.eval(), b.eval(), data=digits, progress=False,
                calibration={"pair": old, "twin": old, "weight_matched": mid})
    ends = res.prediction["endpoint_features"]
    m, se = ends["midpoint_barrier"]["weight_matched"], ends["midpoint_se"]["weight_matched"]
    spec = symmetry_spec(a, digits.train.tensors[0][:2])
    sd = weight_matching(spec, a.state_dict(), b.state_dict()).apply(b.state_dict())
    test = make_loader(torch.utils.data.Subset(digits.test, range(min(2000, len(digits.test)))), 1000)
    train = make_loader(digits.train, 500)
    assert m == pytest.approx(_midpoint_of_path(a, a.state_dict(), sd, test, train), abs=1e-6)
    naive = _midpoint_of_path(a, a.state_dict(), b.state_dict(), test, train)
    assert ends["midpoint_barrier"]["unaligned"] == pytest.approx(naive, abs=1e-6) and naive > m
    assert res.prediction["weight_matched"] == pytest.approx(mid.predict(m, se))
    q = res.pair["features"]["q_optimal"]                 # no activation line: the pair line at 1 − q̄(optimal)
    assert res.prediction["activation_matched"] == pytest.approx(old.predict(1.0 - q))
    assert res.prediction["unaligned"] == pytest.approx(old.predict(1.0 - res.pair["features"]["q_identity"]))


def test_the_midpoints_standard_error_widens_the_interval_in_quadrature():
    line = LogLinear("x", 0.0, 1.0, -0.3, 0.4, 10)
    plain, wide = line.predict(0.2), line.predict(0.2, 0.05)
    assert plain["low"] == pytest.approx(0.2 * np.exp(-0.3)) and plain["high"] == pytest.approx(0.2 * np.exp(0.4))
    spread = 1.6448536269514722 * 0.05 / 0.2
    assert wide["high"] == pytest.approx(0.2 * np.exp(np.hypot(0.4, spread)))
    assert wide["low"] == pytest.approx(0.2 * np.exp(-np.hypot(0.3, spread)))
    assert wide["barrier_mean"] == plain["barrier_mean"]


def test_conformal_bounds_hold_their_level_where_sample_quantiles_fall_short():
    assert conformal_bounds(np.arange(-9.0, 10.0)) == (-9.0, 9.0)          # n = 19: the extremes
    assert conformal_bounds([0.5, 1.0, 2.0]) == (0.0, 2.0)                  # clamped to hold the line
    rng = np.random.default_rng(0)
    n, trials = 20, 4000
    r, new = rng.standard_normal((trials, n)), rng.standard_normal(trials)
    bounds = np.array([conformal_bounds(x) for x in r])
    conformal = np.mean((bounds[:, 0] <= new) & (new <= bounds[:, 1]))
    q = np.quantile(r, [Q_LO, Q_HI], axis=1)                                # negative control: plain quantiles
    plain = np.mean((q[0] <= new) & (new <= q[1]))
    assert conformal >= Q_HI - Q_LO - 0.01 > plain, (conformal, plain)


def test_an_interval_at_the_fits_floor_holds_a_barrier_of_zero():
    """Identical models have a barrier of exactly 0: where the line's lower end falls to the noise floor the interval
    starts at 0 (not at the floor, which would exclude the true value); above the floor it is unchanged."""
    line = LogLinear("midpoint", -1.0, 1.0, -0.3, 0.4, 10, x_floor=0.005)
    at_zero = line.predict(0.0)
    assert at_zero["low"] == 0.0 and at_zero["barrier_mean"] == 0.005 <= at_zero["high"]
    assert line.predict(0.2)["low"] == pytest.approx(0.2 * np.exp(-1.3))
