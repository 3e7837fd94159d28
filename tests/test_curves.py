"""Bezier / polygonal-chain curves ("the path is a module"), the linear path and the Path object."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from modeconn.errors import CheckpointError, ConfigError, StateDictMismatchError
from modeconn.models import build_model
from modeconn.path import (
    CurveModule,
    Path,
    PathCurve,
    bezier_curve,
    evaluate_model,
    evaluate_path,
    linear_path,
    reset_bn_stats,
    train_curve,
)
from modeconn.path.batchnorm import fixed_batches

pytestmark = pytest.mark.usefixtures("one_thread")


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))


def _loader(n=64, bs=32, seed=0):
    ds = _data(n, seed)
    return [(ds.tensors[0][i:i + bs], ds.tensors[1][i:i + bs]) for i in range(0, n, bs)]


def _resnet(seed):
    return build_model("resnet20", in_shape=(1, 8, 8), num_classes=10, width=0.25, seed=seed)


def _mlp(seed, width=16):
    return build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=2, width=width, seed=seed)


def _clone(sd):
    return {k: v.clone() for k, v in sd.items()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bezier_endpoints_are_exact_and_bn_recomputed_loss_matches_the_endpoint():
    model = _resnet(0)
    sd_a, sd_b = _clone(model.state_dict()), _clone(_resnet(1).state_dict())
    keep_a, keep_b, keep_m = _clone(sd_a), _clone(sd_b), _clone(model.state_dict())
    path = bezier_curve(model, sd_a, sd_b, _data(), control_points=1, steps=3, lr=0.01, batch_size=32, n_points=5)
    assert path.method == "bezier-1" and len(path) == 5 and path.t.tolist() == [0, 0.25, 0.5, 0.75, 1]
    assert _same(path[0], keep_a) and _same(path[-1], keep_b)
    assert _same(sd_a, keep_a) and _same(sd_b, keep_b) and _same(model.state_dict(), keep_m), "inputs not mutated"
    assert path.compute["grad_evals"] == 3

    bn_loader = _loader()
    test = _loader(seed=1)
    curve = path.evaluate(model, {"train": bn_loader, "test": test}, bn_loader=bn_loader)
    assert isinstance(curve, PathCurve) and curve.bn == "reset"
    for t_idx, sd in ((0, sd_a), (-1, sd_b)):  # the endpoint, with statistics recomputed the same way
        ref = copy.deepcopy(model)
        ref.load_state_dict(sd)
        reset_bn_stats(ref, fixed_batches(bn_loader, None))
        m = evaluate_model(ref, test)
        assert curve.values("test")[t_idx] == pytest.approx(m["loss"], abs=1e-6)
        assert curve.values("test", "acc")[t_idx] == m["acc"]
    assert np.isfinite(curve.values("train")).all() and curve.length > 0


def test_the_curve_is_a_module_whose_only_trainable_parameters_are_the_control_points():
    model = _mlp(0)
    sd_a, sd_b = model.state_dict(), _mlp(1).state_dict()
    for kind in ("bezier", "polychain"):
        c = CurveModule(model, sd_a, sd_b, kind=kind, control_points=2)
        trainable = [p for p in c.parameters() if p.requires_grad]
        assert len(trainable) == 2 and all(p is q for p, q in zip(trainable, c.controls, strict=False))
        for t in (0.0, 0.3, 0.5, 1.0):
            assert sum(c.weights(t)) == pytest.approx(1.0)
        # control points start on the segment, so the untrained curve is the linear path
        mid = c.params_at(0.4)
        for n in c.names:
            assert torch.allclose(mid[n], torch.lerp(sd_a[n], sd_b[n], 0.4), atol=1e-6)
        # the forward pass is the architecture at φ(t): gradients reach the control points only
        x = torch.randn(4, 1, 8, 8)
        c(x, 0.37).sum().backward()
        assert all(p.grad is not None for p in c.controls)
        assert all(p.grad is None for p in c.net.parameters())
    chain = CurveModule(model, sd_a, sd_b, kind="polychain", control_points=2)
    with torch.no_grad():
        chain.controls[1].add_(1.0)
    at = chain.params_at(2 / 3)  # the second bend
    flat = torch.cat([at[n].reshape(-1) for n in chain.names])
    assert torch.allclose(flat, chain.controls[1], atol=1e-6)
    with pytest.raises(ConfigError, match="kind"):
        CurveModule(model, sd_a, sd_b, kind="spline")
    with pytest.raises(ConfigError, match="t must be in"):
        chain.weights(1.5)


def test_curve_training_moves_controls_not_endpoints_and_is_deterministic():
    model = _mlp(0)
    sd_a, sd_b = model.state_dict(), _mlp(1).state_dict()
    kw = dict(kind="polychain", control_points=1, steps=20, lr=0.05, batch_size=16, seed=5)
    c1 = train_curve(model, sd_a, sd_b, _data(), **kw)
    c2 = train_curve(model, sd_a, sd_b, _data(), **kw)
    init = CurveModule(model, sd_a, sd_b, kind="polychain", control_points=1)
    assert torch.equal(c1.end_a, init.end_a) and torch.equal(c1.end_b, init.end_b)
    assert not torch.equal(c1.controls[0], init.controls[0])
    assert torch.equal(c1.controls[0], c2.controls[0]) and c1.history == c2.history
    assert np.mean(c1.history[-5:]) < np.mean(c1.history[:5]), "training lowers the curve loss"
    p = c1.to_path(4)
    assert _same(p[0], sd_a) and _same(p[-1], sd_b) and p.method == "polychain-1"
    with pytest.raises(StateDictMismatchError):
        train_curve(model, sd_a, _mlp(1, width=24).state_dict(), _data(), steps=1)
    with pytest.raises(ConfigError, match="optimizer"):
        train_curve(model, sd_a, sd_b, _data(), steps=1, optimizer="lbfgs")
    with pytest.raises(ConfigError, match="'step'.*did you mean 'steps'"):  # typo caught before the endpoints
        train_curve(model, sd_a, _mlp(1, width=24).state_dict(), _data(), step=1)


def test_linear_path_equals_evaluate_path_and_round_trips_through_disk(tmp_path):
    model = _mlp(0)
    sd_a, sd_b = model.state_dict(), _mlp(1).state_dict()
    path = linear_path(sd_a, sd_b, 5)
    assert _same(path[0], sd_a) and _same(path[-1], sd_b) and path.compute["grad_evals"] == 0
    loader = _loader()
    ours = path.evaluate(model, {"train": loader}, sub_points=1)
    ref = evaluate_path(model, sd_a, sd_b, {"train": loader}, lambdas=5)
    assert np.allclose(ours.values("train"), ref.values("train"), atol=1e-6)
    # the sub-points of the linear path lie on the same line: a 9-point grid
    dense = evaluate_path(model, sd_a, sd_b, {"train": loader}, lambdas=9)
    assert np.allclose(ours.segment_peaks, dense.values("train")[1::2], atol=1e-6)
    assert ours.length == pytest.approx(path.length([n for n, _ in model.named_parameters()]), rel=1e-9)
    d = sum(((sd_a[k].double() - sd_b[k].double()) ** 2).sum().item() for k, _ in model.named_parameters()) ** 0.5
    assert ours.length == pytest.approx(d, rel=1e-6)
    js = json.loads(json.dumps(ours.to_json()))
    back = PathCurve.from_json(js)
    assert back.length == ours.length and np.allclose(back.segment_peaks, ours.segment_peaks)

    out = path.save(tmp_path / "lin", shard_size=2)
    assert sorted(p.name for p in out.iterdir()) == [
        "path.json", "points-000000.safetensors", "points-000002.safetensors", "points-000004.safetensors"]
    loaded = Path.load(out, model=model)
    assert len(loaded) == 5 and loaded.method == "linear" and loaded.t.tolist() == path.t.tolist()
    assert all(_same(loaded[i], linear_path(sd_a, sd_b, 5)[i]) for i in range(5))
    with pytest.raises(CheckpointError, match="already holds a path"):
        linear_path(sd_a, sd_b, 3).save(out)
    with pytest.raises(StateDictMismatchError, match="different model"):
        Path.load(out, model=_resnet(0))
    with pytest.raises(CheckpointError, match="not a path directory"):
        Path.load(tmp_path / "nothing")


def test_path_input_validation():
    sd_a, sd_b = _mlp(0).state_dict(), _mlp(1).state_dict()
    with pytest.raises(StateDictMismatchError):
        linear_path(sd_a, _mlp(1, width=24).state_dict(), 3)
    with pytest.raises(ConfigError, match="n must"):
        linear_path(sd_a, sd_b, 1)
    with pytest.raises(ConfigError, match="non-decreasing"):
        Path([sd_a, sd_b], t=[1.0, 0.0])
    with pytest.raises(ConfigError, match="one value per point"):
        Path([sd_a, sd_b], t=[0.0])
    with pytest.raises(ConfigError, match="sub_points"):
        linear_path(sd_a, sd_b, 3).evaluate(_mlp(0), _loader(), sub_points=-1)
    with pytest.raises(ConfigError, match="bn_loader"):
        linear_path(_resnet(0).state_dict(), _resnet(1).state_dict(), 3).evaluate(_resnet(0), _loader())
