"""LLPF (M2M, M2O, cross-sphere): variance correction, angle-conformal lr, FDF order, resume, bad inputs,
and a functional check on digits (LLPF peak ≪ linear peak)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

from modeconn.data import load_dataset, make_loader
from modeconn.errors import CheckpointError, ConfigError, StateDictMismatchError
from modeconn.models import build_model
from modeconn.path import Path, fdf_groups, linear_path, llpf_cross_sphere, llpf_m2m, llpf_m2o, scale_to_variance
from modeconn.path.llpf import STATE_FILE, weight_keys
from modeconn.train import TrainConfig, fit


def _data(n=64, in_shape=(1, 8, 8), classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, *in_shape, generator=g), torch.randint(0, classes, (n,), generator=g))


def _mlp(seed):
    return build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=2, width=16, seed=seed)


def _resnet(seed):
    return build_model("resnet20", in_shape=(1, 8, 8), num_classes=10, width=0.25, seed=seed)


def _clone(sd):
    return {k: v.clone() for k, v in sd.items()}


def _same(sd1, sd2):
    return sd1.keys() == sd2.keys() and all(torch.equal(sd1[k], sd2[k]) for k in sd1)


pytestmark = pytest.mark.usefixtures("one_thread")


QUICK = dict(lr=0.01, threshold=0.0, min_steps=1, max_steps=2, batch_size=32)


# ------------------------------------------------------------------------------- variance correction


def test_scale_to_variance_is_exact_and_keeps_the_mean():
    g = torch.Generator().manual_seed(0)
    for shape, target in [((16, 8), 0.02), ((4, 3, 3, 3), 1.7), ((1000,), 1e-5)]:
        t = torch.randn(shape, generator=g) * 0.3 + 0.1
        out = scale_to_variance(t, target)
        assert out.dtype == t.dtype and out.shape == t.shape
        assert torch.var(out.double()).item() == pytest.approx(target, rel=1e-5)
        assert out.double().mean().item() == pytest.approx(t.double().mean().item(), rel=1e-5, abs=1e-7)
    const = torch.ones(5)
    assert torch.equal(scale_to_variance(const, 3.0), const)  # variance 0: unchanged
    with pytest.raises(ConfigError):
        scale_to_variance(t, float("nan"))


def test_the_in_place_projection_llpf_uses_equals_scale_to_variance():
    from modeconn.path.llpf_layers import project_to_variance_

    g = torch.Generator().manual_seed(1)
    for shape, target in [((64, 32), 0.02), ((8, 4, 3, 3), 1.7)]:
        t = torch.randn(shape, generator=g) * 0.3 + 0.1
        inplace = t.clone()
        project_to_variance_(inplace, target)
        assert torch.allclose(inplace, scale_to_variance(t, target), rtol=1e-5, atol=1e-6)
        assert not torch.allclose(inplace, t)  # negative control: it did move the tensor
    const = torch.ones(5)
    project_to_variance_(const, 3.0)
    assert torch.equal(const, torch.ones(5))


@pytest.mark.parametrize("target", ["source", "interpolate"])
def test_m2m_variance_correction_puts_every_weight_on_its_target_sphere(target):
    model = _mlp(0)
    sd_a, sd_b = _clone(model.state_dict()), _clone(_mlp(1).state_dict())
    step, ticks = 0.25, 4
    path = llpf_m2m(model, sd_a, sd_b, _data(), step=step, ticks=ticks, order="all", variance_target=target, **QUICK)
    wk = weight_keys(model)
    assert path.info["corrected"] == wk == ["blocks.0.linear.weight", "blocks.1.linear.weight", "head.weight"]
    assert len(path) == ticks + 2
    for i in range(1, ticks + 1):  # point i is the state after tick i-1
        p = path[i]
        r = (1 - step) ** i  # order="all": every layer moves from tick 0
        for k in wk:
            va, vb = torch.var(sd_a[k].double()).item(), torch.var(sd_b[k].double()).item()
            want = va if target == "source" else vb + r * (va - vb)
            assert torch.var(p[k].double()).item() == pytest.approx(want, rel=1e-5), (i, k)
        # biases are moved but not rescaled: not on any sphere in general
        assert not torch.equal(p["head.bias"], sd_a["head.bias"])


# ------------------------------------------------------------------------------------ M2O: the angle


def _scale_invariant_net():
    # every moved layer is followed by a normalization, so f(c·θ_moved) = f(θ_moved) in train mode; a tiny
    # BN eps makes that exact (with eps = 1e-5 it holds to ~1 % once the weights have shrunk a lot)
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6, eps=1e-12), nn.ReLU(),
        nn.Conv2d(6, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8, eps=1e-12), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10, bias=False), nn.BatchNorm1d(10, eps=1e-12),
    )
    return net


def _angle(a, b):
    ua, ub = a.double().flatten(), b.double().flatten()
    ua, ub = ua / ua.norm(), ub / ub.norm()
    return 2 * math.asin(min(1.0, (ua - ub).norm().item() / 2))


def test_m2o_angle_conformal_lr_keeps_the_angular_step_constant():
    model = _scale_invariant_net()
    sd = _clone(model.state_dict())
    data = _data(32)  # one batch: every refinement step sees the same data
    step, ticks = 0.2, 6
    kw = dict(ticks=ticks, lr=0.005, threshold=0.0, min_steps=1, max_steps=1, batch_size=32)
    conf = llpf_m2o(model, sd, data, step=step, angle_conformal=True, **kw)
    plain = llpf_m2o(model, sd, data, step=step, angle_conformal=False, **kw)
    still = llpf_m2o(model, sd, data, step=1e-6, angle_conformal=True, **kw)  # (almost) no shrinking
    for k in ["0.weight", "3.weight", "8.weight"]:
        a_conf = [_angle(conf[i][k], conf[i + 1][k]) for i in range(ticks)]
        a_plain = [_angle(plain[i][k], plain[i + 1][k]) for i in range(ticks)]
        a_still = [_angle(still[i][k], still[i + 1][k]) for i in range(ticks)]
        assert min(a_conf) > 1e-3, "the refinement step is measurable"
        # while ‖w‖ shrinks to (0.8)^6 = 26 %, each refinement turns w by the same angle as without shrinking
        assert a_conf == pytest.approx(a_still, rel=1e-3), (k, a_conf, a_still)
        assert max(a_conf) / min(a_conf) < 1.2, (k, a_conf)
        # plain lr: the angular step grows as 1/(1-s)^2 per tick (here ×1.56 per tick)
        assert a_plain[-1] / a_plain[0] > 4.0, (k, a_plain)
        # the weights do shrink toward the origin: ‖w‖ by (1−s) per tick (the refinement adds ~angle²)
        for i in range(ticks):
            ratio = conf[i + 1][k].norm().item() / conf[i][k].norm().item()
            assert ratio == pytest.approx(1 - step, rel=1e-3)
    # normalization layers are never moved; with no refinement they stay exactly as they were
    frozen = llpf_m2o(model, sd, data, step=step, ticks=2, max_steps=0, min_steps=0, batch_size=32)
    for key in ("1.weight", "1.bias", "9.weight", "9.bias"):
        assert torch.equal(frozen[-1][key], sd[key])
    assert torch.allclose(frozen[-1]["0.weight"], sd["0.weight"] * (1 - step) ** 2)
    assert _same(model.state_dict(), sd), "the model is never mutated"


# ---------------------------------------------------------------------------------------- FDF order


def test_fdf_order_on_resnet20_follows_the_data_flow():
    groups = fdf_groups(_resnet(0))
    owners = [g[0].rsplit(".", 1)[0] for g in groups]
    expected = ["stem.conv"]
    for s in range(3):
        for j in range(3):
            expected += [f"stages.{s}.{j}.block1.conv", f"stages.{s}.{j}.conv2"]
            if s > 0 and j == 0:
                expected.append(f"stages.{s}.{j}.shortcut.0")  # the parallel branch: its own group
    expected.append("head")
    assert owners == expected
    # each conv carries its own BN; the shortcut conv carries the shortcut BN
    assert groups[0] == ["stem.conv.weight", "stem.norm.weight", "stem.norm.bias"]
    sc = groups[owners.index("stages.1.0.shortcut.0")]
    assert sc == ["stages.1.0.shortcut.0.weight", "stages.1.0.shortcut.1.weight", "stages.1.0.shortcut.1.bias"]
    assert groups[-1] == ["head.weight", "head.bias"]
    flat = [k for g in groups for k in g]
    assert sorted(flat) == sorted(n for n, _ in _resnet(0).named_parameters())
    stage_level = fdf_groups(_resnet(0), level=2)
    assert [g[0].rsplit(".", 1)[0].split(".block1")[0] for g in stage_level] == [
        "stem.conv", "stages.0.0", "stages.1.0", "stages.2.0", "head"]


def test_m2m_on_resnet_endpoints_are_the_inputs_and_inputs_are_not_mutated():
    model = _resnet(0)
    sd_a, sd_b = _clone(model.state_dict()), _clone(_resnet(1).state_dict())
    keep_a, keep_b, keep_m = _clone(sd_a), _clone(sd_b), _clone(model.state_dict())
    path = llpf_m2m(model, sd_a, sd_b, _data(), step=0.3, ticks=5, unlock_every=1, fdf_level=2, **QUICK)
    assert _same(path[0], keep_a) and _same(path[-1], keep_b)
    assert _same(sd_a, keep_a) and _same(sd_b, keep_b) and _same(model.state_dict(), keep_m)
    assert path.t[0] == 0.0 and path.t[-1] == 1.0 and (path.t[1:] >= path.t[:-1]).all()
    recs = path.info["records"]
    assert [r["unlocked"] for r in recs] == [1, 2, 3, 4, 5]  # one more FDF group (stem, stage, …, head) per tick
    # a group moves only once unlocked: the head (last group) moved once, so it is still far from B
    assert path.info["final_gap"] > 0.3
    assert path.compute["grad_evals"] == 5 * 2 and path.method == "llpf-m2m"


def test_bad_inputs_raise_clear_errors():
    model = _mlp(0)
    other = build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=2, width=24, seed=1).state_dict()
    with pytest.raises(StateDictMismatchError, match="blocks.0.linear.weight"):
        llpf_m2m(model, model.state_dict(), other, _data(), ticks=1, **QUICK)
    with pytest.raises(StateDictMismatchError):
        llpf_cross_sphere(model, model.state_dict(), other, _data(), ticks=1, **QUICK)
    with pytest.raises(StateDictMismatchError):
        llpf_m2o(model, other, _data(), ticks=1, **QUICK)
    sd_b = _mlp(1).state_dict()
    with pytest.raises(ConfigError, match="order"):
        llpf_m2m(model, model.state_dict(), sd_b, _data(), order="backwards", ticks=1, **QUICK)
    with pytest.raises(ConfigError, match="missing"):
        llpf_m2m(model, model.state_dict(), sd_b, _data(), order=[["head.weight"]], ticks=1, **QUICK)
    with pytest.raises(ConfigError, match="step"):
        llpf_m2m(model, model.state_dict(), sd_b, _data(), step=1.5, ticks=1, **QUICK)
    with pytest.raises(ConfigError, match="min_steps"):
        llpf_m2m(model, model.state_dict(), sd_b, _data(), ticks=1, lr=0.1, threshold=0.1, min_steps=5, max_steps=2)


def test_unreachable_threshold_stops_at_max_steps_and_keeps_the_partial_path():
    model = _mlp(0)
    sd_a, sd_b = _clone(model.state_dict()), _clone(_mlp(1).state_dict())
    kw = dict(step=0.2, ticks=3, order="all", lr=0.01, threshold=-1.0, min_steps=0, max_steps=3, batch_size=32)
    path = llpf_m2m(model, sd_a, sd_b, _data(), **kw)
    assert path.info["unreached_ticks"] == [0, 1, 2] and not path.info["threshold_reached_all"]
    assert path.info["reached_b"] and _same(path[-1], sd_b)
    assert all(r["steps"] == 3 and r["reached"] is False for r in path.info["records"])
    assert path.compute["grad_evals"] == 9
    partial = llpf_m2m(model, sd_a, sd_b, _data(), stop_on_unreached=True, **kw)
    assert not partial.info["reached_b"] and partial.info["ticks_done"] == 1
    assert len(partial) == 2 and _same(partial[0], sd_a) and not _same(partial[-1], sd_b)
    assert _same(partial[1], path[1]), "same seed, same first tick"


# ------------------------------------------------------------------------------------ resume, on disk


def _dropout_net(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 24), nn.ReLU(), nn.Dropout(0.3), nn.Linear(24, 10))


def test_resume_after_a_kill_gives_the_same_path_bytes(tmp_path):
    model = _dropout_net(0)
    sd_a, sd_b = _clone(model.state_dict()), _clone(_dropout_net(1).state_dict())
    kw = dict(step=0.2, ticks=7, checkpoint_every=2, lr=0.05, threshold=0.5, min_steps=1, max_steps=3, batch_size=16,
              seed=3)
    full = llpf_m2m(model, sd_a, sd_b, _data(), out_dir=tmp_path / "full", **kw)

    class Killed(Exception):
        pass

    def kill_at_5(tick, total):
        if tick == 5:
            raise Killed

    with pytest.raises(Killed):
        llpf_m2m(model, sd_a, sd_b, _data(), out_dir=tmp_path / "run", progress=kill_at_5, **kw)
    assert (tmp_path / "run" / STATE_FILE).is_file() and not (tmp_path / "run" / "path.json").exists()
    with pytest.raises(CheckpointError, match="resume=True"):
        llpf_m2m(model, sd_a, sd_b, _data(), out_dir=tmp_path / "run", **kw)
    with pytest.raises(ConfigError, match="different settings"):
        llpf_m2m(model, sd_a, sd_b, _data(), out_dir=tmp_path / "run", resume=True, **{**kw, "lr": 0.02})
    resumed = llpf_m2m(model, sd_a, sd_b, _data(), out_dir=tmp_path / "run", resume=True, **kw)

    shards_full = sorted(p.name for p in (tmp_path / "full").glob("points-*.safetensors"))
    shards_run = sorted(p.name for p in (tmp_path / "run").glob("points-*.safetensors"))
    assert shards_full == shards_run and len(shards_full) == 4  # 9 points: 0-2 | 3-4 | 5-6 | 7-8 (+ B)
    for name in shards_full:
        assert (tmp_path / "full" / name).read_bytes() == (tmp_path / "run" / name).read_bytes()
    assert resumed.t.tolist() == full.t.tolist() and len(resumed) == len(full) == 9
    assert resumed.info["records"] == full.info["records"]
    assert resumed.compute["grad_evals"] == full.compute["grad_evals"]
    # in memory, the same settings give the same points too
    mem = llpf_m2m(model, sd_a, sd_b, _data(), **{k: v for k, v in kw.items() if k != "checkpoint_every"})
    assert all(_same(mem[i], full[i]) for i in range(len(full)))
    # a finished run is just loaded
    again = llpf_m2m(model, sd_a, sd_b, _data(), out_dir=tmp_path / "run", resume=True, **kw)
    assert len(again) == 9 and _same(again[-1], sd_b)

    # the path directory knows its model
    loaded = Path.load(tmp_path / "full", model=model)
    assert _same(loaded[0], sd_a) and loaded.method == "llpf-m2m"
    with pytest.raises(StateDictMismatchError, match="full"):
        Path.load(tmp_path / "full", model=_resnet(0))
    with pytest.raises(StateDictMismatchError, match="different model"):
        loaded.evaluate(_mlp(0), _data())
    shard = tmp_path / "full" / shards_full[1]
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=shards_full[1]):
        Path.load(tmp_path / "full")


def test_cross_sphere_reaches_the_destination_sphere_then_connects():
    model = _resnet(0)
    sd_a = _clone(model.state_dict())
    sd_b = {k: (v * 0.5 if v.dim() >= 2 else v.clone()) for k, v in _resnet(1).state_dict().items()}  # smaller sphere
    path = llpf_cross_sphere(model, sd_a, sd_b, _data(), m2o_step=0.3, m2o_max_ticks=10, sphere_rtol=0.01, step=0.5,
                             ticks=2, order="all", **QUICK)
    assert path.info["sphere_reached"] is True
    b = path.info["phase_boundary"]
    assert 1 <= b < len(path) - 1 and path.info["m2o_ticks"] == b
    for k in weight_keys(model):  # on B's sphere at the switch (refinement moves it a little)
        vb = torch.var(sd_b[k].double()).item()
        assert torch.var(path[b][k].double()).item() == pytest.approx(vb, rel=0.05), k
    assert _same(path[0], sd_a) and _same(path[-1], sd_b)
    assert path.method == "llpf-cross-sphere"


# ------------------------------------------------------------------------------------- functional


@pytest.mark.slow
def test_llpf_path_on_digits_has_a_much_lower_peak_than_the_linear_path():
    ds = load_dataset("digits")
    sds = []
    for seed in (0, 1):
        m = build_model("mlp", in_shape=(1, 8, 8), num_classes=10, depth=2, width=64, seed=seed)
        fit(m, ds.train, TrainConfig(epochs=8, lr=0.05, batch_size=64, seed=seed, weight_decay=0.0, warmup_epochs=0),
            progress=False)
        sds.append(_clone(m.state_dict()))
    loaders = {"train": make_loader(ds.train, 512), "test": make_loader(ds.test, 512)}
    lin = linear_path(sds[0], sds[1], 11).evaluate(m, loaders)
    path = llpf_m2m(m, sds[0], sds[1], ds.train, step=0.1, ticks=30, order="fdf", lr=0.05, threshold=0.1,
                    min_steps=2, max_steps=30, batch_size=64)
    curve = path.evaluate(m, loaders, sub_points=1)
    ends = max(curve.values("train")[0], curve.values("train")[-1])
    assert ends < 0.15
    assert lin.peak("train") > 0.4  # independent modes: a real barrier
    assert curve.peak("train") < 0.5 * lin.peak("train"), (curve.peak("train"), lin.peak("train"))
    assert curve.dense_peak("train") < 0.5 * lin.peak("train")
    assert curve.length > 0 and 0 < path.compute["grad_evals"] <= 30 * 30
    assert curve.to_json()["path"]["n_points"] == len(path) == 32


@pytest.mark.parametrize("arch", ["mobilenetv2", "cct"])
def test_llpf_on_the_depthwise_and_attention_architectures_follows_their_data_flow(arch):
    from archs import ARCHS

    _, name, kwargs, in_shape = next(a for a in ARCHS if a[0] == arch)
    model_a = build_model(name, in_shape=in_shape, num_classes=10, seed=0, **kwargs)
    model_b = build_model(name, in_shape=in_shape, num_classes=10, seed=1, **kwargs)
    groups = fdf_groups(model_a)
    flat = [k for g in groups for k in g]
    assert sorted(flat) == sorted(n for n, _ in model_a.named_parameters())  # every parameter once
    first, last = flat[0], flat[-1]
    assert first.startswith(("stem", "tokenizer")) and last.startswith("head")  # stem first, classifier last
    data = _data(64, in_shape)
    path = llpf_m2m(model_a, model_a.state_dict(), model_b.state_dict(), data, ticks=len(groups) + 2, step=0.3,
                    unlock_every=1, **QUICK)
    assert _same(path[0], model_a.state_dict()) and _same(path[len(path) - 1], model_b.state_dict())
