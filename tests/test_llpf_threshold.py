"""LLPF's refinement target relative to the endpoints: the rule, its consistency with the low-loss verdict, the
measured endpoint losses a run uses (with a negative control), a given threshold kept, and the run's random stream
untouched by the measurement."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from modeconn.errors import ConfigError
from modeconn.models import build_model
from modeconn.nn_utils import mean_cross_entropy
from modeconn.path import llpf, llpf_m2m, llpf_m2o
from modeconn.path.llpf import THRESHOLD_MARGIN, relative_threshold
from modeconn.path.pathobj import CONTINUITY_TOL, LOW_LOSS_MARGIN
from modeconn.train import fit

pytestmark = pytest.mark.usefixtures("one_thread")

N = 64
RUN = dict(ticks=2, step=0.5, lr=0.01, min_steps=1, max_steps=2, batch_size=N, order="all")  # full-batch minibatches


def _data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(N, 1, 8, 8, generator=g), torch.randint(0, 10, (N,), generator=g))


def _mlp(seed):
    return build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=1, width=16, seed=seed)


@pytest.fixture(scope="module")
def pair():
    """A trained on the data (low loss), B untrained (chance loss): endpoints with clearly different losses."""
    data = _data()
    a = _mlp(0)
    fit(a, data, {"epochs": 30, "lr": 0.1, "batch_size": 16, "seed": 0}, progress=False)
    return a, _clone(a.state_dict()), _clone(_mlp(1).state_dict()), data


def _clone(sd):
    return {k: v.detach().clone() for k, v in sd.items()}


@torch.no_grad()
def _full_loss(model, sd, data):
    net = _mlp(2)  # never the run's model: loading into it would overwrite tensors shared with a state dict
    net.load_state_dict(sd)
    x, y = data.tensors
    return mean_cross_entropy(net.train()(x), y).item()


def _check_relative(path, model, sds, data, margin=THRESHOLD_MARGIN):
    """The run's threshold is the higher endpoint's loss (here: the full-data loss, every minibatch being the whole
    set) plus the margin, and the refinement used that value."""
    expected = max(_full_loss(model, sd, data) for sd in sds) + margin
    info = path.info["threshold"]
    assert info["rule"] == "relative"
    assert info["value"] == pytest.approx(expected, rel=1e-5)
    assert path.info["settings"]["threshold"] == info["value"]


def test_the_rule_is_the_higher_endpoint_plus_the_margin_inside_the_low_loss_band():
    assert relative_threshold([0.2, 0.5]) == pytest.approx(0.5 + THRESHOLD_MARGIN)
    assert relative_threshold([0.5, 0.2], margin=0.01) == pytest.approx(0.51)
    assert relative_threshold([0.0016]) == pytest.approx(0.0016 + THRESHOLD_MARGIN)
    # consistency with the verdict: a point at the target plus a segment's allowed rise is at the low-loss margin
    assert THRESHOLD_MARGIN + CONTINUITY_TOL == pytest.approx(LOW_LOSS_MARGIN)
    from modeconn.recipes.path import LOW_LOSS_MARGIN as verdict_margin
    assert verdict_margin == LOW_LOSS_MARGIN
    for bad in ([], [0.1, math.nan], [math.inf]):
        with pytest.raises(ConfigError):
            relative_threshold(bad)


def test_a_run_targets_the_higher_measured_endpoint_either_way_round(pair):
    model, sd_a, sd_b, data = pair
    la, lb = _full_loss(model, sd_a, data), _full_loss(model, sd_b, data)
    assert lb > la + 1.0  # the endpoints differ: a rule reading only one of them would be caught
    for a, b in ((sd_a, sd_b), (sd_b, sd_a)):
        path = llpf_m2m(model, a, b, data, **RUN)
        _check_relative(path, model, (a, b), data)
    path = llpf_m2m(model, sd_a, sd_b, data, threshold_margin=0.02, **RUN)
    _check_relative(path, model, (sd_a, sd_b), data, margin=0.02)
    m2o = llpf_m2o(model, sd_a, data, ticks=2, step=0.5, lr=0.01, min_steps=1, max_steps=2, batch_size=N)
    _check_relative(m2o, model, (sd_a,), data)  # M2O: the source is the only endpoint


def test_negative_control_a_rule_reading_only_the_source_is_caught(pair, monkeypatch):
    model, sd_a, sd_b, data = pair
    real = llpf._Run._endpoint_losses
    monkeypatch.setattr(llpf._Run, "_endpoint_losses", lambda self, sds, c: real(self, sds[:1], c))
    path = llpf_m2m(model, sd_a, sd_b, data, **RUN)
    with pytest.raises(AssertionError):
        _check_relative(path, model, (sd_a, sd_b), data)


def test_a_given_threshold_is_kept_and_the_measurement_leaves_the_runs_random_stream_alone(pair):
    model, sd_a, sd_b, data = pair
    relative = llpf_m2m(model, sd_a, sd_b, data, **RUN)
    value = relative.info["threshold"]["value"]
    given = llpf_m2m(model, sd_a, sd_b, data, threshold=value, **RUN)
    assert given.info["threshold"] == {"value": value, "rule": "given"}
    assert all(torch.equal(p[k], q[k]) for p, q in zip(relative, given, strict=True) for k in p)
    other = llpf_m2m(model, sd_a, sd_b, data, threshold=0.3, **RUN)
    assert other.info["settings"]["threshold"] == 0.3


def _results(low, unreached, threshold=True):
    info = {"ticks_done": 10, "unreached_ticks": list(range(unreached))}
    if threshold:
        info["threshold"] = {"value": 0.0516, "rule": "relative"}
    return {"path_info": info, "low_loss": {"low_loss": low}}


def test_a_report_says_why_an_llpf_path_is_not_low_loss():
    from modeconn.recipes.path import not_low_loss_why

    assert "3 of 10 LLPF ticks ended their refinement above the target 0.0516" in not_low_loss_why(_results(False, 3))
    assert "every LLPF tick reached the target 0.0516" in not_low_loss_why(_results(False, 0))
    assert not_low_loss_why(_results(True, 3)) == ""  # low-loss: nothing to explain
    assert not_low_loss_why(_results(False, 3, threshold=False)) == ""  # not an LLPF path
