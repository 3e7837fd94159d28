"""``check``'s predictions after alignment on the MNIST pair of Getting started (3 × 512 MLPs, 2 epochs, seeds 0 and
1): the shipped calibration predicts the weight- and activation-matched barriers that the paths measure, each inside
its stated interval and within a factor :data:`NEAR` of the measured one; the headline says the pair merges after
alignment. Negative control: the calibration shipped before (the unaligned line read at the aligned x, which
predicted 0.40 / 0.20 for measured 0.06 / 0.04) fails the same assertion."""

from __future__ import annotations

import math

import pytest

from modeconn import build_model
from modeconn.data import load_dataset, make_loader
from modeconn.diagnostics import LogLinear, check
from modeconn.match import weight_matching
from modeconn.path import evaluate_path
from modeconn.recipes.check_report import verdict
from modeconn.symmetry import symmetry_spec
from modeconn.train import TrainConfig, fit

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

NEAR = 2.5
"""A prediction counts as near when it is within this factor of the measured barrier (either way)."""
PREVIOUS = {"pair": LogLinear("1 - mean unit correlation", -0.1746150238657197, 1.2454360339878205,
                              -0.9983698441603617, 0.7120251790409331, 32),
            "twin": LogLinear("min relative swap cost", -1.2050459725733391, -0.36978723334775815,
                              -0.8626601148759844, 1.2086292066195068, 30)}
"""The calibration shipped before the aligned lines (its aligned predictions read the unaligned pair line)."""


@pytest.fixture(scope="module")
def mnist_pair(shared_data):
    data = load_dataset("mnist", shared_data)
    models = []
    for seed in (0, 1):
        m = build_model("mlp", in_shape=tuple(data.input_shape), num_classes=10, seed=seed, width=512, depth=3)
        fit(m, data.train, TrainConfig(epochs=2, seed=seed), progress=False)
        models.append(m.eval())
    return (*models, data)


def measured_barriers(a, b, data) -> dict[str, float]:
    """``barrier --eval-limit 2000``: the weight- and activation-matched paths on the first 2000 test examples."""
    import torch

    from modeconn.match import activation_matching

    spec = symmetry_spec(a, data.train.tensors[0][:2])
    test = {"test": make_loader(torch.utils.data.Subset(data.test, range(2000)), 1000)}
    sa, sb = a.state_dict(), b.state_dict()
    am = activation_matching(spec, a, b, make_loader(data.train, 1000), max_batches=5, progress=False)
    return {name: evaluate_path(a, sa, sd, test, lambdas=11).barrier("mean", "test")
            for name, sd in (("weight_matched", weight_matching(spec, sa, sb).apply(sb)),
                             ("activation_matched", am.apply(sb)))}


def near(prediction: dict[str, float], measured: float) -> bool:
    inside = prediction["low"] <= measured <= prediction["high"]
    return inside and abs(math.log(prediction["barrier_mean"] / measured)) <= math.log(NEAR)


def test_shipped_calibration_predicts_the_aligned_barriers_of_the_mnist_pair(mnist_pair):
    a, b, data = mnist_pair
    measured = measured_barriers(a, b, data)
    assert max(measured.values()) < 0.1, measured   # the pair merges after either alignment
    res = check(a, b, data=data, progress=False)
    for key, value in measured.items():
        assert near(res.prediction[key], value), (key, res.prediction[key], value)
    assert res.prediction["go"] is False and res.prediction["unaligned"]["barrier_mean"] > 0.1
    line = verdict({"prediction": res.prediction, "recommendation": res.recommendation, "pair": res.pair})
    assert line.startswith("NO-GO as they are, GO after weight matching"), line
    old = check(a, b, data=data, progress=False, calibration=PREVIOUS)   # negative control
    assert not all(near(old.prediction[k], v) for k, v in measured.items()), old.prediction
