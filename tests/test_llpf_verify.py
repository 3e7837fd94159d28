"""LLPF's verification in the evaluation's terms (BatchNorm recomputed, eval mode, fixed minibatches) and its closing
ticks: the endpoints' verified losses are the evaluation's, a tick stops only once its check passes (negative
control: a check that is skipped), the forward passes are counted apart from the gradient evaluations, and closing
ticks halve the gap to B."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from modeconn.models import build_model
from modeconn.nn_utils import mean_cross_entropy
from modeconn.path import llpf, llpf_m2m, llpf_m2o
from modeconn.path.batchnorm import reset_bn_stats

pytestmark = pytest.mark.usefixtures("one_thread")

N = 48
RUN = dict(ticks=3, step=0.4, lr=0.05, min_steps=1, max_steps=6, batch_size=N, order="all")  # full-batch minibatches


def _resnet(seed):
    return build_model("resnet20", in_shape=(1, 8, 8), num_classes=10, width=0.25, seed=seed)


def _data():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(N, 1, 8, 8, generator=g), torch.randint(0, 10, (N,), generator=g))


def _perturbed(seed):
    """A ResNet's state with non-trivial BatchNorm affines and statistics (stock init hides missing bindings)."""
    net = _resnet(seed)
    g = torch.Generator().manual_seed(seed + 10)
    with torch.no_grad():
        for name, t in net.state_dict().items():
            if t.is_floating_point() and ("bn" in name or "norm" in name):
                t.add_(0.3 * torch.randn(t.shape, generator=g)).abs_()
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


@torch.no_grad()
def _evaluated(sd, data):
    """The evaluation's terms on the whole (one-minibatch) set: BatchNorm recomputed on it, eval-mode loss."""
    net = _resnet(5)
    net.load_state_dict(sd)
    x, y = data.tensors
    reset_bn_stats(net, [x])
    return mean_cross_entropy(net.eval()(x), y).item()


@pytest.fixture(scope="module")
def pair():
    return _resnet(0), _perturbed(0), _perturbed(1), _data()


def test_the_verified_target_is_the_higher_endpoints_evaluated_loss_plus_the_margin(pair):
    model, sd_a, sd_b, data = pair
    path = llpf_m2m(model, sd_a, sd_b, data, verify_batches=1, threshold_margin=0.02, **RUN)
    verify = path.info["threshold"]["verify"]
    expected = [_evaluated(sd_a, data), _evaluated(sd_b, data)]
    assert verify["batches"] == 1
    assert verify["endpoint_losses"] == pytest.approx(expected, rel=1e-5)
    assert verify["value"] == pytest.approx(max(expected) + 0.02, rel=1e-5)
    assert path.info["verify_forwards"] > 0 and path.info["verify_forwards"] % 2 == 0
    # the train-mode target is still the endpoints' train-mode loss: in other terms than the verified one
    assert not math.isclose(path.info["threshold"]["value"], verify["value"], rel_tol=1e-3)


def test_every_stored_point_of_a_verified_tick_meets_the_target_in_the_evaluations_terms(pair):
    model, sd_a, sd_b, data = pair
    path = llpf_m2m(model, sd_a, sd_b, data, verify_batches=1, **{**RUN, "max_steps": 30})
    target = path.info["threshold"]["verify"]["value"]
    records = path.info["records"]
    assert len(path) == len(records) + 2  # A, one point per tick, B
    for i, rec in enumerate(records, start=1):
        if rec["reached"]:
            assert rec["verified_loss"] <= target
            assert _evaluated(path[i], data) == pytest.approx(rec["verified_loss"], rel=1e-4)


def test_a_failed_check_keeps_refining_and_negative_control_without_the_check(pair, monkeypatch):
    model, sd_a, sd_b, data = pair
    calls = []

    def failing_twice(self):
        calls.append(1)
        self.s["verify_forwards"] = self.s.get("verify_forwards", 0) + 2
        return self.verify_target + (1.0 if len(calls) % 3 else -1.0)  # fails twice, then passes

    monkeypatch.setattr(llpf._Run, "_verified", failing_twice)
    run = dict(RUN, min_steps=2, max_steps=50, ticks=2, threshold=100.0)  # the train-mode window always passes
    path = llpf_m2m(model, sd_a, sd_b, data, verify_batches=1, **run)
    steps = [r["steps"] for r in path.info["records"]]
    assert steps == [6, 6]  # 2 steps to the first check, 2 more after each of the two failures
    assert all(r["reached"] for r in path.info["records"])
    assert path.compute["grad_evals"] == 12 and path.info["verify_forwards"] == 12
    unchecked = llpf_m2m(model, sd_a, sd_b, data, **run)
    assert [r["steps"] for r in unchecked.info["records"]] == [2, 2]  # without the check: no extra steps
    assert "verify_forwards" not in unchecked.info and "verify" not in unchecked.info["threshold"]


def test_a_check_that_never_passes_ends_the_tick_at_its_step_limit_unreached(pair, monkeypatch):
    model, sd_a, sd_b, data = pair
    monkeypatch.setattr(llpf._Run, "_verified", lambda self: math.inf)
    path = llpf_m2m(model, sd_a, sd_b, data, verify_batches=1, **dict(RUN, threshold=100.0, max_steps=4))
    assert [r["steps"] for r in path.info["records"]] == [4, 4, 4]
    assert path.info["unreached_ticks"] == [0, 1, 2]


def _gap(path, sd_b, coords):
    last = path[len(path) - 2]
    num = math.sqrt(sum(float((last[k] - sd_b[k]).double().pow(2).sum()) for k in coords))
    den = math.sqrt(sum(float((path[0][k] - sd_b[k]).double().pow(2).sum()) for k in coords))
    return num / den


def test_closing_ticks_divide_the_closing_segment_into_equal_parts_and_keep_the_endpoints(pair):
    model, sd_a, sd_b, data = pair
    coords = [n for n, _ in model.named_parameters()]
    plain = llpf_m2m(model, sd_a, sd_b, data, **RUN)
    closed = llpf_m2m(model, sd_a, sd_b, data, closing_ticks=3, **RUN)
    assert closed.info["final_gap"] == pytest.approx(plain.info["final_gap"] / 4, rel=1e-4)
    assert _gap(closed, sd_b, coords) == pytest.approx(closed.info["final_gap"], rel=1e-4)
    assert [bool(r.get("closing")) for r in closed.info["records"]] == [False] * 3 + [True] * 3
    assert [r["steps"] for r in closed.info["records"]][3:] == [0, 0, 0]
    n = len(plain)
    for i in range(n - 1):  # the schedule's points are unchanged
        assert all(torch.equal(plain[i][k], closed[i][k]) for k in coords)
    last = plain[n - 2]
    for j in range(1, 4):  # the closing points lie on the straight segment to B, at equal spacing
        point = closed[n - 2 + j]
        for k in coords:
            torch.testing.assert_close(point[k], last[k] + (sd_b[k] - last[k]) * (j / 4), rtol=1e-4, atol=1e-5)
    assert all(torch.equal(closed[0][k], sd_a[k]) and torch.equal(closed[len(closed) - 1][k], sd_b[k]) for k in sd_a)


def test_closing_ticks_take_no_share_of_the_budget_and_m2o_ignores_them(pair):
    model, sd_a, sd_b, data = pair
    run = dict(RUN, max_steps=50, threshold=-1.0)  # every tick refines its whole fair share
    path = llpf_m2m(model, sd_a, sd_b, data, closing_ticks=2, budget=21, **run)
    assert path.compute["grad_evals"] == 21
    assert [r["steps"] for r in path.info["records"]] == [7, 7, 7, 0, 0]
    m2o = llpf_m2o(model, sd_a, data, closing_ticks=4, **dict(RUN, max_steps=1))
    assert m2o.info["ticks_done"] == 3
