"""Interpolation, BatchNorm policies, barriers, merging and REPAIR."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
from archs import digest, make

import modeconn as mc
from modeconn.errors import ConfigError, NonFiniteError, StateDictMismatchError
from modeconn.path import Curve, channel_stats, interpolate, reset_bn_stats, weighted_average


def _loader(in_shape, n=4, bs=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(bs, *in_shape, generator=g), torch.randint(0, 5, (bs,), generator=g)) for _ in range(n)]


def test_interpolation_endpoints_exact_and_integer_buffers_from_a():
    a, _ = make("mlp-bn", seed=0)
    b, _ = make("mlp-bn", seed=1)
    sa, sb = a.state_dict(), b.state_dict()
    sb = {k: (v + 7 if not v.is_floating_point() else v) for k, v in sb.items()}
    for k, v in interpolate(sa, sb, 0.0).items():
        assert torch.equal(v, sa[k])
    one = interpolate(sa, sb, 1.0)
    for k, v in one.items():
        assert torch.equal(v, sb[k] if v.is_floating_point() else sa[k])
    mid = interpolate(sa, sb, 0.5)
    for k, v in mid.items():
        assert v.dtype == sa[k].dtype
        if not v.is_floating_point():
            assert torch.equal(v, sa[k])


def test_low_precision_interpolation_keeps_dtype():
    a, _ = make("mlp", seed=0)
    b, _ = make("mlp", seed=1)
    sa = {k: v.half() for k, v in a.state_dict().items()}
    sb = {k: v.half() for k, v in b.state_dict().items()}
    mid = interpolate(sa, sb, 0.3)
    ref = interpolate({k: v.float() for k, v in sa.items()}, {k: v.float() for k, v in sb.items()}, 0.3)
    for k in mid:
        assert mid[k].dtype == torch.float16
        assert torch.equal(mid[k], ref[k].half()), "computed in fp32, cast once at the end"
    with pytest.raises(StateDictMismatchError, match="shape"):
        weighted_average([sa, {**sb, "blocks.0.linear.weight": sb["blocks.0.linear.weight"][:1]}])


def test_bn_reset_equals_hand_computed_cumulative_average():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    batches = [torch.randn(n, 5) for n in (7, 13, 10)]  # unequal sizes: every sample weighs the same (issue #14)
    reset_bn_stats(model, batches)
    with torch.no_grad():
        pre = torch.cat([model[0](x) for x in batches])
    mean, var = pre.mean(0), pre.var(0, unbiased=True)
    torch.testing.assert_close(model[1].running_mean, mean)
    torch.testing.assert_close(model[1].running_var, var)
    assert model[1].momentum == 0.1, "momentum restored"


def test_evaluate_path_endpoints_and_no_mutation():
    a, x = make("resnet20-bn", seed=0)
    b, _ = make("resnet20-bn", seed=1)
    loader = _loader(x.shape[1:])
    sa, sb = a.state_dict(), b.state_dict()
    da, db, dm = digest(sa), digest(sb), digest(a.state_dict())
    a.train()
    curve = mc.evaluate_path(a, sa, sb, {"train": loader, "test": loader[:2]}, lambdas=5, bn_loader=loader)
    assert a.training and digest(a.state_dict()) == dm and digest(sa) == da and digest(sb) == db
    ea = mc.path.evaluate_model(a, loader)
    eb = mc.path.evaluate_model(b, loader)
    assert curve.values("train")[0] == pytest.approx(ea["loss"], abs=0)
    assert curve.values("train")[-1] == pytest.approx(eb["loss"], abs=0)
    assert curve.splits == ["train", "test"] and len(curve.lambdas) == 5


def test_bn_policies_differ_and_keep_uses_a_stats():
    a, x = make("vgg-bn", seed=0)
    b, _ = make("vgg-bn", seed=1)
    loader = _loader(x.shape[1:])
    curves = {bn: mc.evaluate_path(a, a.state_dict(), b.state_dict(), loader, lambdas=3, bn=bn, bn_loader=loader)
              for bn in ("reset", "interpolate", "keep")}
    mids = {k: c.values()[1] for k, c in curves.items()}
    assert len(set(np.round(list(mids.values()), 6))) == 3
    with pytest.raises(ConfigError, match="bn_loader"):
        mc.evaluate_path(a, a.state_dict(), b.state_dict(), loader, bn="reset")
    with pytest.raises(ConfigError, match="unknown bn policy 'rest'"):
        mc.evaluate_path(a, a.state_dict(), b.state_dict(), loader, bn="rest")
    with pytest.raises(ConfigError, match="lambdas"):
        mc.evaluate_path(a, a.state_dict(), b.state_dict(), loader, lambdas=[0.5, 2.0], bn_loader=loader)


def test_barrier_definitions():
    lam = np.linspace(0, 1, 5)
    loss = np.array([1.0, 2.0, 4.0, 2.5, 3.0])
    acc = np.array([0.9, 0.6, 0.3, 0.7, 0.8])
    c = Curve(lam, {"test": {"loss": loss, "acc": acc}})
    assert c.barrier("mean") == pytest.approx(4.0 - 2.0)
    assert c.barrier("interp") == pytest.approx(max(loss - (1 + 2 * lam)))  # chord 1 → 3
    assert c.peak() == 4.0
    assert c.barrier("mean", metric="error") == pytest.approx(0.7 - 0.5 * (0.1 + 0.2))
    assert c.accuracy_drop() == pytest.approx((0.9 - 0.3) / 0.9 * 100)
    with pytest.raises(ConfigError, match="unknown barrier kind"):
        c.barrier("max")
    with pytest.raises(ConfigError, match="unknown split"):
        c.barrier("mean", split="val")
    assert Curve.from_json(c.to_json()).barrier("interp") == c.barrier("interp")


def test_merge_weights_and_validation():
    a, x = make("mlp", seed=0)
    b, _ = make("mlp", seed=1)
    sa, sb = a.state_dict(), b.state_dict()
    da = digest(sa)
    m = mc.merge([sa, sb], [1.0, 0.0])
    assert all(torch.equal(m[k], sa[k]) for k in sa) and digest(sa) == da
    three = mc.merge([sa, sb, sb], model=a)
    torch.testing.assert_close(three["head.weight"], (sa["head.weight"] + 2 * sb["head.weight"]) / 3)
    with pytest.raises(ConfigError, match="at least two"):
        mc.merge([sa])
    with pytest.raises(ConfigError, match="weights"):
        mc.merge([sa, sb], [0.5])
    bad = dict(sb, **{"head.bias": sb["head.bias"] * float("inf")})
    with pytest.raises(NonFiniteError, match="head.bias"):
        mc.merge([sa, bad])
    with pytest.raises(StateDictMismatchError, match="head.bias"):
        mc.merge([sa, {k: v for k, v in sb.items() if k != "head.bias"}])


@pytest.mark.parametrize("arch", ["mlp", "resnet20-bn", "resnet20-ln"])
def test_repair_matches_target_statistics(arch):
    a, x = make(arch, seed=0)
    b, _ = make(arch, seed=1)
    loader = _loader(x.shape[1:], n=6, bs=32)
    spec = mc.symmetry_spec(a, x)
    sb = spec.apply(b.state_dict(), mc.weight_matching(spec, a.state_dict(), b.state_dict()).element)
    merged = mc.merge([a.state_dict(), sb], model=a, bn="repair", bn_loader=loader, spec=spec)
    points = list(spec.repair_points)
    batches = [xb for xb, _ in loader]
    stats_a = channel_stats(a, points, batches)
    b.load_state_dict(sb)
    stats_b = channel_stats(b, points, batches)
    m = make(arch)[0]
    m.load_state_dict(merged)
    stats_m = channel_stats(m, points, batches)
    first = points[0][0]
    for i in range(2):  # the first repair point is corrected exactly (its input does not change)
        target = 0.5 * (stats_a[first][i] + stats_b[first][i])
        torch.testing.assert_close(stats_m[first][i], target, atol=2e-2, rtol=2e-2)
    err = [float(((stats_m[p][1] - 0.5 * (stats_a[p][1] + stats_b[p][1])).abs()
                  / (0.5 * (stats_a[p][1] + stats_b[p][1]) + 1e-3)).mean()) for p, _ in points]
    assert np.mean(err) < 0.15, err


def test_asymmetric_models_share_fixed_structure_exactly():
    from modeconn.models import build_model

    def asym(seed, mask_seed):
        return build_model("mlp", in_shape=(1, 6, 6), num_classes=5, seed=seed, depth=2, width=16,
                           asymmetric={"sigma_f": 1.0, "num_fixed": 4, "mask_seed": mask_seed})

    a, b, other = asym(0, 7), asym(1, 7), asym(1, 8)
    mid = interpolate(a.state_dict(), b.state_dict(), 0.37)
    for k, v in mid.items():
        if k.endswith(("fixed_offsets", "fixed_mask")):
            assert torch.equal(v, a.state_dict()[k]), "shared F/D must stay bit-exact"
    loader = _loader((1, 6, 6))
    with pytest.raises(ConfigError, match="fixed structure .*mask_seed"):
        mc.evaluate_path(a, a.state_dict(), other.state_dict(), loader, lambdas=3)
    with pytest.raises(ConfigError, match="fixed structure"):
        mc.merge([a.state_dict(), other.state_dict()], model=a)


def test_merge_bn_policies_on_statistics():
    a, x = make("mlp-bn", seed=0)
    b, _ = make("mlp-bn", seed=1)
    sa, sb = a.state_dict(), b.state_dict()
    loader = _loader(x.shape[1:])
    keep = mc.merge([sa, sb], model=a, bn="keep")
    interp = mc.merge([sa, sb], model=a, bn="interpolate")
    reset = mc.merge([sa, sb], model=a, bn="reset", bn_loader=loader)
    for k in sa:
        if k.endswith("running_mean"):
            assert torch.equal(keep[k], sa[k])
            torch.testing.assert_close(interp[k], 0.5 * (sa[k] + sb[k]))
            assert not torch.equal(reset[k], interp[k])
