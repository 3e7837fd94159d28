"""``modeconn check`` (issue #19): unit tests of the diagnostics and the predictor, and the three verdicts the issue
asks for on real trained MNIST MLPs (fine-tunes of one base, independent standard MLPs, W-asymmetric σ_F = 1)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from torch import nn

from cli_runner import run_cli
from modeconn import build_model, save_checkpoint
from modeconn.data import load_dataset
from modeconn.diagnostics import GO_THRESHOLD, LogLinear, check, fit_loglinear
from modeconn.diagnostics.check import pair_features
from modeconn.diagnostics.pair import linear_cka
from modeconn.diagnostics.structure import layer_identifiability
from modeconn.errors import ConfigError
from modeconn.experiments.identifiability import ADAMW
from modeconn.experiments.training import train_models
from modeconn.train import TrainConfig, fit

MLP = dict(depth=3, width=64, norm="layernorm", activation="gelu")
ASYM = {"asymmetric": {"sigma_f": 1.0, "density": 0.125, "mask_seed": 1000}}


# ------------------------------------------------------------------------------------------- pure math
def test_linear_cka_is_one_for_rotated_scaled_copies_and_low_for_independent_noise():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 16, generator=g)
    q, _ = torch.linalg.qr(torch.randn(16, 16, generator=g))
    assert linear_cka(x, 3.0 * x @ q) == pytest.approx(1.0, abs=1e-9)
    assert linear_cka(x, torch.randn(2000, 16, generator=g)) < 0.05
    with pytest.raises(ConfigError, match="same number"):
        linear_cka(x, x[:10])


def test_fit_loglinear_recovers_a_planted_line_and_predicts_with_its_interval():
    xs = [0.1, 0.2, 0.3, 0.5, 0.7, 0.9]   # barriers above B_FLOOR: no flooring
    bs = [math.exp(-1.0 + 1.5 * math.log(x)) for x in xs]
    m = fit_loglinear("x", xs, bs)
    assert (m.intercept, m.slope) == (pytest.approx(-1.0), pytest.approx(1.5))
    p = m.predict(0.3)
    assert p["barrier_mean"] == pytest.approx(bs[2]) and p["low"] <= p["barrier_mean"] <= p["high"]
    with pytest.raises(ConfigError, match="as many barriers"):
        fit_loglinear("x", [0.1, 0.2, 0.3], [0.1, 0.2])


def test_realization_diagnostics_see_no_breaking_in_a_standard_layer_and_breaking_with_fixed_offsets():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3000, 40, generator=g, dtype=torch.float64) @ torch.randn(40, 40, generator=g, dtype=torch.float64)
    std = build_model("mlp", in_shape=(1, 1, 40), num_classes=10, depth=2, width=32, seed=0)
    asym = build_model("mlp", in_shape=(1, 1, 40), num_classes=10, depth=2, width=32, seed=0, **ASYM)
    first = lambda m: next(mod for mod in m.modules() if isinstance(mod, nn.Linear))  # noqa: E731
    s, a = layer_identifiability(first(std), x), layer_identifiability(first(asym), x)
    assert s["relative_swap_cost"] == 0.0 and not s["asymmetric"] and s["center_nn_ratio"] is None
    assert a["relative_swap_cost"] > 1.0 and a["identity_optimal"] and a["swap_positive_fraction"] > 0.9
    assert 1 <= a["k"] <= 40 and a["coherence"] >= 1.0 - 1e-6


def test_permutation_share_tells_permuted_from_rotated_units():
    n = 32
    eye = torch.eye(n, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    space = {"s": {"identity_ratio": 1.0, "q_identity": 1.0, "q_weight": 1.0, "q_optimal": 1.0, "cka": 1.0}}
    cos = {"w": {"identity": 0.1, "weight_matched": 0.5}}
    assert pair_features(space, cos, {"s": eye[torch.randperm(n)]})["permutation_share"] == pytest.approx(1.0)
    rotated = dict(space, s={**space["s"], "q_optimal": float(q.abs().max(dim=1).values.mean())})
    assert pair_features(rotated, cos, {"s": q})["permutation_share"] < 0.5


# ------------------------------------------------------------------------------------------- trained MNIST MLPs
@pytest.fixture(scope="module")
def mnist(shared_data):
    return load_dataset("mnist", shared_data, limit_train=4000, limit_test=1000)


def _train(bundle, seeds, **kw):
    return train_models("mlp", bundle, seeds, {**ADAMW, "epochs": 4}, **MLP, **kw)


@pytest.fixture(scope="module")
def finetunes(mnist, one_thread):
    (base,) = _train(mnist, (0,))
    out = []
    for seed in (1, 2):
        m = copy.deepcopy(base).train()
        fit(m, mnist.train, TrainConfig(**{**ADAMW, "lr": 1e-4, "epochs": 1, "seed": seed}), progress=False)
        out.append(m.eval())
    return out


@pytest.mark.slow
def test_check_on_two_finetunes_of_one_base_says_no_alignment_needed(finetunes, mnist):
    res = check(*finetunes, data=mnist)
    assert res.pair["relationship"]["name"] == "fine-tunes of one base"
    assert res.recommendation["method"] == "none" and res.prediction["go"]
    assert res.prediction["unaligned"]["barrier_mean"] < GO_THRESHOLD


@pytest.mark.slow
def test_check_on_two_independent_mlps_says_align_with_a_permutation(mnist, one_thread):
    """Each aligned prediction has its own calibrated line: either permutation method may be the one predicted to
    merge (weight matching is recommended first when both are)."""
    a, b = _train(mnist, (0, 1))
    res = check(a, b, data=mnist)
    assert res.recommendation["method"] in ("weight matching", "activation matching") and not res.prediction["go"]
    assert res.recommendation["method"] == "weight matching" or res.prediction["weight_matched"]["barrier_mean"] >= GO_THRESHOLD
    assert res.pair["relationship"]["name"] == "independent runs, permutations suffice"
    p = res.prediction
    assert p["weight_matched"]["barrier_mean"] < p["unaligned"]["barrier_mean"]
    assert res.pair["features"]["weight_cosine_matched"] > res.pair["features"]["weight_cosine_identity"]
    twin = check(a, data=mnist)                  # A alone: an independent twin of a standard MLP needs alignment
    assert not twin.pair and not twin.prediction["go"] and twin.recommendation["method"] == "weight matching"


@pytest.mark.slow
def test_check_on_two_w_asymmetric_mlps_with_sigma_1_says_no_alignment_needed(mnist, one_thread):
    a, b = _train(mnist, (0, 1), **ASYM)
    res = check(a, b, data=mnist)
    assert res.recommendation["method"] == "none" and res.prediction["go"]
    assert res.pair["features"]["identity_ratio"] > 0.9
    assert all(v["asymmetric"] and v["relative_swap_cost"] > 0 for v in res.layers.values())


# ------------------------------------------------------------------------------------------- command line
@pytest.mark.slow
def test_check_command_writes_its_report_and_refuses_bad_input_first(tmp_path, finetunes, mnist):
    a, b = tmp_path / "a", tmp_path / "b"
    for path, m in ((a, finetunes[0]), (b, finetunes[1])):
        save_checkpoint(path, m, config={"dataset": "mnist", "dataset_options": {}})
    res = run_cli("check", a, b, "--limit-train", 2000, "--out", tmp_path / "out")
    assert "GO" in res.output and "relationship: fine-tunes of one base" in res.output
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["recommendation"]["method"] == "none" and set(results["prediction"]) >= {"unaligned", "twin", "go"}
    assert (tmp_path / "out" / "check.png").stat().st_size > 0 and "# modeconn check" in (tmp_path / "out" / "report.md").read_text()
    alone = run_cli("check", a, "--limit-train", 2000, "--out", tmp_path / "alone")
    assert "an independently trained twin of it" in alone.output
    other = tmp_path / "c"
    save_checkpoint(other, build_model("mlp", in_shape=(1, 28, 28), num_classes=10, depth=2, width=8, seed=0),
                    config={"dataset": "mnist"})
    bad = run_cli("check", a, other, "--out", tmp_path / "bad", ok=False)
    assert bad.exit_code == 2 and "one architecture" in bad.output and not (tmp_path / "bad").exists()
    missing = run_cli("check", tmp_path / "nope", "--out", tmp_path / "bad2", ok=False)
    assert missing.exit_code == 2 and "nope" in missing.output


def test_check_refuses_bad_arguments_before_any_forward_pass(mnist):
    m = build_model("mlp", in_shape=(1, 28, 28), num_classes=10, depth=2, width=8, seed=0)
    other = build_model("mlp", in_shape=(1, 28, 28), num_classes=10, depth=2, width=16, seed=0)
    with pytest.raises(ConfigError, match="DatasetBundle"):
        check(m, m, data="mnist")
    with pytest.raises(ConfigError, match="one architecture"):
        check(m, other, data=mnist)
    with pytest.raises(ConfigError, match="max_batches"):
        check(m, data=mnist, max_batches=0)
    assert isinstance(LogLinear("x", 0.0, 1.0, -1.0, 1.0, 3).predict(0.5)["barrier_mean"], float)


def test_check_reads_convolutions_as_patches_and_is_exported_as_mc_check(shared_data, one_thread):
    import modeconn as mc

    fm = load_dataset("fashion-mnist", shared_data, limit_train=300, limit_test=200)
    kw = dict(in_shape=(1, 28, 28), num_classes=10, width=0.5, **ASYM)
    a, b = (build_model("resnet20", seed=s, **kw).eval() for s in (0, 1))
    res = mc.check(a, b, data=fm, max_batches=1, batch_size=100, eval_limit=200)
    mods = dict(a.named_modules())
    convs = {n: v for n, v in res.layers.items() if isinstance(mods[n], nn.Conv2d)}
    assert convs and all(v["asymmetric"] for v in convs.values())
    assert all(v["fan_in"] == mods[n].weight[0].numel() for n, v in convs.items())   # unfolded patches: C·kh·kw
    assert all(v["relative_swap_cost"] > 0 for v in convs.values())
    assert set(res.pair["spaces"]) and res.recommendation["method"] in {r.name for r in mc.diagnostics.RECOMMENDATIONS}


@pytest.mark.parametrize("unaligned,wm,am,method", [
    (1.16, 0.317, 0.216, "activation matching"),  # both halve the barrier: the lower one
    (0.388, 0.160, 0.312, "weight matching"),  # weight matching halves it, activation matching does not
    (1.0, 0.30, 0.30, "weight matching"),  # a tie: the data-free one
    (1.0, 0.60, 0.70, "no linear path: use LLPF"),  # neither halves it
    (1.0, 0.05, 0.01, "weight matching")])  # both go: the data-free one first
def test_the_recommended_alignment_is_the_one_predicted_lowest(unaligned, wm, am, method):
    from modeconn.diagnostics.check import _recommend

    pred = {"not_applicable": False, **{k: {"barrier_mean": v} for k, v in
                                        (("unaligned", unaligned), ("weight_matched", wm), ("activation_matched", am))}}
    assert _recommend(pred, {"relationship": {"name": "independent runs, permutations suffice"}})["method"] == method
