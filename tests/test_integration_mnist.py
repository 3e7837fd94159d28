"""Acceptance on real MNIST (../shared/data): independently trained MLPs are separated by a large naive
barrier that weight and activation matching each cut below 25% (barrier_mean on test loss)."""

from __future__ import annotations

import pytest

import modeconn as mc
from modeconn.data import load_dataset, make_loader
from modeconn.models import build_model
from modeconn.train import TrainConfig, fit

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mnist_pair(shared_data):
    bundle = load_dataset("mnist", shared_data, limit_train=12000, limit_test=3000)
    models = []
    for seed in (0, 1):
        m = build_model("mlp", in_shape=bundle.input_shape, num_classes=10, seed=seed, depth=3, width=256)
        fit(m, bundle.train, TrainConfig(seed=seed, epochs=4, lr=0.05, batch_size=128), progress=False)
        models.append(m.eval())
    return bundle, models


def test_matching_cuts_the_mnist_barrier(mnist_pair):
    bundle, (a, b) = mnist_pair
    spec = mc.symmetry_spec(a, bundle.train.tensors[0][:2])
    test = make_loader(bundle.test, 1000)
    sa, sb = a.state_dict(), b.state_dict()
    naive = mc.evaluate_path(a, sa, sb, {"test": test}, lambdas=11).barrier("mean", "test")
    wm = mc.weight_matching(spec, sa, sb)
    am = mc.activation_matching(spec, a, b, make_loader(bundle.train, 1000))
    b_wm = mc.evaluate_path(a, sa, wm.apply(sb), {"test": test}, lambdas=11).barrier("mean", "test")
    b_am = mc.evaluate_path(a, sa, am.apply(sb), {"test": test}, lambdas=11).barrier("mean", "test")
    assert naive > 0.3, naive
    assert b_wm < 0.25 * naive, (b_wm, naive)
    assert b_am < 0.25 * naive, (b_am, naive)


def test_learned_matching_beats_naive_midpoint(mnist_pair):
    bundle, (a, b) = mnist_pair
    spec = mc.symmetry_spec(a, bundle.train.tensors[0][:2])
    sa, sb = a.state_dict(), b.state_dict()
    res = mc.learned_matching(spec, a, sa, sb, make_loader(bundle.train, 256, shuffle=True), steps=60,
                              lambda_schedule="fixed", lambda_value=0.5, init=spec.identity())
    test = {"test": make_loader(bundle.test, 1000)}
    mid = lambda sd: mc.evaluate_path(a, sa, sd, test, lambdas=[0.0, 0.5, 1.0]).values("test")[1]  # noqa: E731
    assert mid(res.apply(sb)) < 0.5 * mid(sb)
    assert len(res.history[0]) == 60 and all(v == v for v in res.history[0])


def test_repair_on_batchnorm_resnet(shared_data):
    """BN-ResNet20 midpoint: stale statistics (keep) below both corrections, REPAIR at reset's level (Jordan et al.
    2023). These briefly trained models sit near collapse at the midpoint (20–25% accuracy), where REPAIR and reset
    differ by a few points either way, so REPAIR is held to within 5 points of reset; a REPAIR that corrected nothing
    would stay at keep's accuracy."""
    bundle = load_dataset("fashion-mnist", shared_data, limit_train=3000, limit_test=1000)
    models = []
    for seed in (0, 1):
        m = build_model("resnet20", in_shape=bundle.input_shape, num_classes=10, seed=seed, width=0.5)
        fit(m, bundle.train, TrainConfig(seed=seed, epochs=2, lr=0.05, batch_size=128), progress=False)
        models.append(m.eval())
    a, b = models
    spec = mc.symmetry_spec(a, bundle.train.tensors[0][:2])
    sb = mc.weight_matching(spec, a.state_dict(), b.state_dict()).apply(b.state_dict())
    test = {"test": make_loader(bundle.test, 500)}
    bn_loader = make_loader(bundle.train, 256, shuffle=True)
    acc = {bn: mc.evaluate_path(a, a.state_dict(), sb, test, lambdas=[0.0, 0.5, 1.0], bn=bn, bn_loader=bn_loader,
                                spec=spec).values("test", "acc")[1] for bn in ("keep", "reset", "repair")}
    assert acc["keep"] < min(acc["reset"], acc["repair"]), acc
    assert acc["repair"] >= acc["reset"] - 0.05, acc
