"""`modeconn experiment lmc-dm-vit --quick` (CI size): dual learned matching (LMC-DM, METHODS.md §3) on a pair of
standard ViTs trained on Fashion-MNIST; the planted-MiniLM check of dual matching on a cut-down MiniLM; the
``vit-tiny`` architecture it trains."""

from __future__ import annotations

import json

import pytest
import torch
from cli_runner import run_cli

from modeconn.errors import ConfigError
from modeconn.models import build_model

pytestmark = [pytest.mark.experiment, pytest.mark.usefixtures("one_thread", "shared_data")]


def test_quick_lmc_dm_vit_lowers_the_loss_and_accuracy_barriers_and_keeps_the_endpoints(tmp_path):
    from modeconn.experiments.lmc_dm import MAIN
    from modeconn.experiments.lmc_dm_vit import ABLATIONS

    out = tmp_path / "vit"
    run_cli("experiment", "lmc-dm-vit", "--quick", "--out", out)
    assert {"results.json", "report.md", "vit_dm_barrier.png"} <= {p.name for p in out.iterdir()}
    r = json.loads((out / "results.json").read_text())
    assert list(r["barriers"]) == list(MAIN) and list(r["ablations"]) == list(ABLATIONS)
    b = {k: v["barrier_mean"] for k, v in r["barriers"].items()}
    acc = {k: v["acc_barrier_mean"] for k, v in r["barriers"].items()}
    assert b["WM"] < 0.5 * b["naive"] and acc["WM"] < acc["naive"]
    assert r["barriers"]["WM"]["min_acc"] > r["barriers"]["naive"]["min_acc"]
    for learned in ("dual", "one-sided learned"):
        assert b[learned] < b["naive (absorbed)"]
        assert b[learned] <= b["WM"] + 0.01
    # every path starts and ends at the trained models' functions (absorption and the transforms keep them)
    ref, ref_acc = r["barriers"]["naive"]["endpoint_loss"], r["barriers"]["naive"]["endpoint_acc"]
    assert min(ref_acc) > 0.6  # the models learned something (chance is 0.1)
    for v in [*r["barriers"].values(), *r["ablations"].values()]:
        assert v["endpoint_loss"] == pytest.approx(ref, abs=1e-4)
        assert v["endpoint_acc"] == pytest.approx(ref_acc, abs=2e-3)
        assert v["min_acc"] <= min(v["endpoint_acc"]) + 1e-9
    report = (out / "report.md").read_text()
    assert "Learned-matching budget" in report and "Training budget" in report and "min accuracy" in report
    assert all(k in report for k in ABLATIONS) and "Planted MiniLM" not in report  # quick: MiniLM has its own test


def test_planted_minilm_dual_matching_rejoins_the_copy(shared_data):
    from modeconn.experiments.planted_dm import MiniLMDMSize, minilm_report, planted_minilm_dual

    m = planted_minilm_dual(shared_data / "minilm", MiniLMDMSize(layers=2, steps=60, wm_init_steps=10, train_blocks=64,
                                                                 test_blocks=16, lambdas=5),
                            data=shared_data, log=lambda s: None)
    assert m["layers"] == 2 and m["discrete_recovered"]
    bar = m["barrier"]
    # weight matching recovers g⁻¹ exactly, and dual matching started there stays there: barrier ≈ 0
    assert bar["WM (full element)"] < 1e-8 and bar["dual (WM init)"] < 1e-8
    assert m["max_rel_distance"]["dual (WM init)"] < 1e-4
    # from the identity, dual matching lowers the barrier of the planted copy by an order of magnitude
    assert bar["before learning"] > 0.1
    assert bar["dual (identity init)"] < 0.1 * bar["before learning"]
    for r in m["runs"].values():  # both transformed endpoints compute A's hidden states
        assert max(r["max_output_change"].values()) < 1e-4 * m["output_scale"]
    assert max(m["runs"]["dual (WM init)"]["element_rel_error"].values()) < 1e-4
    assert "Planted MiniLM" in minilm_report(m)


def test_vit_tiny_is_a_plain_logits_model_with_a_hugging_face_spec():
    from modeconn.symmetry import symmetry_spec

    a = build_model("vit-tiny", in_shape=(1, 28, 28), num_classes=10, seed=0, patch_size=7, hidden_size=32,
                    intermediate_size=64)
    b = build_model("vit-tiny", in_shape=(1, 28, 28), num_classes=10, seed=0, patch_size=7, hidden_size=32,
                    intermediate_size=64)
    x = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = a.eval()(x)
        torch.testing.assert_close(b.eval()(x), out, rtol=0, atol=0)  # same seed, same bytes
    assert out.shape == (3, 10) and out.dtype == torch.float32
    spec = symmetry_spec(a)  # dispatched to the Hugging Face ViT adapter (no fx tracing)
    g = spec.random_element(seed=1)
    moved = build_model("vit-tiny", in_shape=(1, 28, 28), num_classes=10, patch_size=7, hidden_size=32,
                        intermediate_size=64)
    moved.load_state_dict(spec.apply(a.state_dict(), g))
    with torch.no_grad():
        torch.testing.assert_close(moved.eval()(x), out, rtol=1e-4, atol=1e-5)
    with pytest.raises(ConfigError, match="patch"):
        build_model("vit-tiny", in_shape=(1, 28, 28), num_classes=10, patch_size=5)
    with pytest.raises(ConfigError, match="divisible"):
        build_model("vit-tiny", in_shape=(1, 28, 28), num_classes=10, hidden_size=30, num_attention_heads=4)
    with pytest.raises(ConfigError, match=r"\(batch, 1, 28, 28\)"):
        a(torch.randn(2, 1, 32, 32))
