"""Weight / activation / learned matching: planted recovery, invariants, bad input."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from archs import ARCH_IDS, digest, make

import modeconn as mc
from modeconn.errors import DeviceMismatchError, NonFiniteError, StateDictMismatchError
from modeconn.match import solve_lap
from modeconn.match.activation import CorrelationStats
from modeconn.match.weight import scored_keys


def _recovered(spec, res, g):
    return spec.equal(spec.compose(res.element, g), spec.identity())


@pytest.mark.parametrize("arch", ARCH_IDS)
def test_weight_matching_recovers_planted_permutations(arch):
    """20 random plants per architecture (residual nets included); restarts make recovery reliable."""
    model, x = make(arch)
    spec = mc.symmetry_spec(model, x)
    sd = model.state_dict()
    before = digest(sd)
    hits, first_try = 0, 0
    for seed in range(20):
        g = spec.random_element(seed=seed)
        sd_b = spec.apply(sd, g)
        res = mc.weight_matching(spec, sd, sd_b, seed=seed)
        hits += _recovered(spec, res, g)
        first_try += res.stats["restarts_run"] == 1
        hist = res.history[0]
        assert all(b >= a - 1e-4 * abs(a) for a, b in zip(hist, hist[1:], strict=False)), "objective must not decrease"
    assert digest(sd) == before
    assert hits == 20, f"{arch}: recovered {hits}/20 planted permutations"


def test_weight_matching_restarts_help_on_residual_mlp():
    """A residual MLP (width 32, 8 blocks): plain coordinate descent from the identity (git-re-basin) stalls on
    some planted permutations; the greedy data-flow start plus restarts recovers all of them."""

    class ResMLP(nn.Module):
        def __init__(self, width=32, blocks=8):
            super().__init__()
            self.inp = nn.Linear(10, width)
            self.blocks = nn.ModuleList(
                nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width)) for _ in range(blocks)
            )
            self.out = nn.Linear(width, 3)

        def forward(self, x):
            h = self.inp(x)
            for b in self.blocks:
                h = h + b(h)
            return self.out(h)

    torch.manual_seed(0)
    model = ResMLP()
    spec = mc.symmetry_spec(model, torch.randn(2, 10))
    assert len(spec.spaces) == 1 + 8  # one residual stream + one hidden space per block
    sd = model.state_dict()
    plain = default = 0
    for seed in range(20):
        g = spec.random_element(seed=seed)
        sd_b = spec.apply(sd, g)
        plain += _recovered(spec, mc.weight_matching(spec, sd, sd_b, restarts=1, init="identity", seed=seed), g)
        default += _recovered(spec, mc.weight_matching(spec, sd, sd_b, seed=seed), g)
    assert default == 20 and plain < 20, (plain, default)


def test_weight_matching_scores_parameters_not_batchnorm_statistics():
    """B is a planted permutation of A's weights whose BatchNorm running variances are large and ordered by a decoy
    permutation. The statistics move with the element but are not scored, so the plant is recovered; scoring them
    (the broken variant: every bound tensor) matches the variances instead of the weights."""
    model, x = make("resnet20-bn")
    spec = mc.symmetry_spec(model, x)
    sd = model.state_dict()
    assert {k for k in sd if "running" in k} == spec.buffers & {k for k in sd if "running" in k} != set()
    gen = torch.Generator().manual_seed(0)
    sd = {k: (torch.rand(v.shape, generator=gen) + 0.5) * 50 if "running_var" in k else v for k, v in sd.items()}
    g, decoy = spec.random_element(seed=5), spec.random_element(seed=6)
    sd_b, stats = spec.apply(sd, g), spec.apply(sd, decoy)
    sd_b = {k: stats[k] if k in spec.buffers else v for k, v in sd_b.items()}
    assert _recovered(spec, mc.weight_matching(spec, sd, sd_b, seed=0), g)
    every = [k for k, b in spec.tensors.items() if b and sd[k].is_floating_point()]
    assert not _recovered(spec, mc.weight_matching(spec, sd, sd_b, seed=0, keys=every), g)


def test_weight_matching_is_deterministic_and_reports():
    model, x = make("resnet20-bn")
    other, _ = make("resnet20-bn", seed=1)
    spec = mc.symmetry_spec(model, x)
    r1 = mc.weight_matching(spec, model.state_dict(), other.state_dict(), seed=3)
    r2 = mc.weight_matching(spec, model.state_dict(), other.state_dict(), seed=3)
    assert spec.equal(r1.element, r2.element) and r1.objective == r2.objective
    assert r1.stats["lap_calls"] > 0 and r1.stats["lap_seconds"] <= r1.stats["seconds"]
    aligned = spec.apply(other.state_dict(), r1.element)
    keys = scored_keys(spec, model.state_dict())
    assert keys and not any("running" in k for k in keys)  # BatchNorm statistics move with the element, unscored
    naive = sum(float((model.state_dict()[k] * other.state_dict()[k]).sum()) for k in keys)
    assert r1.objective >= naive
    assert abs(sum(float((model.state_dict()[k] * aligned[k]).sum()) for k in keys)
               - r1.objective) < 1e-3 * abs(r1.objective)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_weight_matching_low_precision(dtype):
    model, x = make("mlp-bn")
    spec = mc.symmetry_spec(model, x)
    g = spec.random_element(seed=7)
    sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    sd_b = spec.apply(sd, g)
    res = mc.weight_matching(spec, sd, sd_b)
    assert _recovered(spec, res, g)
    assert all(v.dtype == sd[k].dtype for k, v in res.apply(sd_b).items())


def test_weight_matching_bad_input():
    model, x = make("mlp")
    spec = mc.symmetry_spec(model, x)
    sd = model.state_dict()
    nan = dict(sd)
    key = next(k for k in sd if k.endswith("weight"))
    nan[key] = sd[key].clone()
    nan[key][0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=key.replace(".", r"\.")):
        mc.weight_matching(spec, sd, nan)
    missing = {k: v for k, v in sd.items() if k != key}
    with pytest.raises(StateDictMismatchError, match=key.replace(".", r"\.")):
        mc.weight_matching(spec, sd, missing)
    shaped = dict(sd, **{key: sd[key][:, :-1]})
    with pytest.raises(StateDictMismatchError, match=r"shape"):
        mc.weight_matching(spec, sd, shaped)
    meta = {k: v.to("meta") for k, v in sd.items()}
    with pytest.raises(DeviceMismatchError, match="meta"):
        mc.weight_matching(spec, sd, meta)


def test_lap_rejects_nan_and_maximises():
    score = torch.tensor([[1.0, 5.0], [4.0, 1.0]])
    assert solve_lap(score, "P").tolist() == [1, 0]
    with pytest.raises(NonFiniteError, match="space 'P'"):
        solve_lap(torch.tensor([[float("nan"), 1.0], [0.0, 1.0]]), "P")


def test_correlation_with_dead_units_is_finite():
    st = CorrelationStats(3, torch.device("cpu"))
    xa = torch.randn(50, 3)
    xa[:, 1] = 0.0  # dead unit
    xb = xa[:, [2, 0, 1]] * 2 + 1
    st.update(xa, xb)
    c = st.correlation()
    assert torch.isfinite(c).all() and (c[1] == 0).all() and (c[:, 2] == 0).all()
    torch.testing.assert_close(c[0, 1], torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(c[2, 0], torch.tensor(1.0, dtype=torch.float64))


@pytest.mark.parametrize("arch", ["mlp", "mlp-bn", "vgg-bn", "resnet20-ln"])
def test_activation_matching_recovers_planted(arch):
    model, _ = make(arch)
    spec = mc.symmetry_spec(model, make(arch)[1])
    in_shape = make(arch)[1].shape[1:]
    gen = torch.Generator().manual_seed(0)
    loader = [(torch.randn(64, *in_shape, generator=gen), torch.zeros(64, dtype=torch.long)) for _ in range(4)]
    g = spec.random_element(seed=11)
    model_b, _ = make(arch)
    model_b.load_state_dict(spec.apply(model.state_dict(), g))
    before_a, before_b = digest(model.state_dict()), digest(model_b.state_dict())
    model.train()
    res = mc.activation_matching(spec, model, model_b, loader)
    assert model.training and not model_b.training, "training flags restored"
    assert digest(model.state_dict()) == before_a and digest(model_b.state_dict()) == before_b
    # dead units make some matches arbitrary; every live unit must be recovered, so logits must agree
    aligned = copy.deepcopy(model_b)
    aligned.load_state_dict(res.apply(model_b.state_dict()))
    x = loader[0][0]
    with torch.no_grad():
        torch.testing.assert_close(aligned.eval()(x), model.eval()(x), atol=1e-5, rtol=1e-5)
    assert all(v <= 1.0 + 1e-9 for v in res.stats["mean_matched_correlation"].values())


def test_learned_matching_planted():
    model, x = make("mlp")
    spec = mc.symmetry_spec(model, x)
    g = spec.random_element(seed=2)
    sd = model.state_dict()
    sd_b = spec.apply(sd, g)
    loader = [(x, torch.zeros(len(x), dtype=torch.long))]
    res = mc.learned_matching(spec, model, sd, sd_b, loader, steps=5, init=spec.identity())
    assert _recovered(spec, res, g)
    assert len(res.history[0]) == 5


def test_greedy_start_beats_identity_start_on_independent_nets():
    model, x = make("vgg-bn", seed=0)
    other, _ = make("vgg-bn", seed=1)
    spec = mc.symmetry_spec(model, x)
    sa, sb = model.state_dict(), other.state_dict()
    greedy = mc.weight_matching(spec, sa, sb, restarts=1)
    ident = mc.weight_matching(spec, sa, sb, restarts=1, init="identity")
    best = mc.weight_matching(spec, sa, sb, restarts=4)
    assert greedy.objective >= ident.objective
    assert best.objective >= max(greedy.objective, ident.objective) - 1e-6
    with pytest.raises(mc.errors.ConfigError, match="init must be"):
        mc.weight_matching(spec, sa, sb, init="random-ish")


def test_activation_identity_ratio():
    model, x = make("mlp")
    spec = mc.symmetry_spec(model, x)
    loader = [(torch.randn(64, *x.shape[1:], generator=torch.Generator().manual_seed(0)), torch.zeros(64))]
    same = mc.activation_matching(spec, model, copy.deepcopy(model), loader)
    assert all(r == pytest.approx(1.0) for r in same.stats["identity_ratio"].values())
    permuted = copy.deepcopy(model)
    permuted.load_state_dict(spec.apply(model.state_dict(), spec.random_element(seed=3)))
    moved = mc.activation_matching(spec, model, permuted, loader)
    assert all(r < 0.5 for r in moved.stats["identity_ratio"].values())
