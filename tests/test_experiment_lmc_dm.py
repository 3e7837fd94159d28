"""`modeconn experiment lmc-dm --quick` (CI size) and `modeconn align --method dual|learned` on language-model
checkpoints: dual learned matching (LMC-DM, METHODS.md §3) on a GPT-NeoX pair trained on the Austen text."""

from __future__ import annotations

import json

import pytest
import torch
from cli_runner import run_cli

pytestmark = [pytest.mark.experiment, pytest.mark.usefixtures("one_thread", "shared_data")]


def test_quick_lmc_dm_learned_matching_lowers_the_barrier_and_keeps_the_endpoints(tmp_path):
    from modeconn.experiments.lmc_dm import ABLATIONS, MAIN

    out = tmp_path / "dm"
    run_cli("experiment", "lmc-dm", "--quick", "--out", out)
    assert {"results.json", "report.md", "lm_dm_barrier.png"} <= {p.name for p in out.iterdir()}
    r = json.loads((out / "results.json").read_text())
    assert list(r["barriers"]) == list(MAIN) and list(r["ablations"]) == list(ABLATIONS)
    b = {k: v["barrier_mean"] for k, v in r["barriers"].items()}
    for learned in ("dual", "one-sided learned"):
        assert b[learned] < b["naive"] and b[learned] < b["naive (absorbed)"]
        assert b[learned] <= b["WM"] + 1e-3
    ref = r["barriers"]["naive"]["endpoint_loss"]  # every path starts and ends at the trained models' functions
    for v in [*r["barriers"].values(), *r["ablations"].values()]:
        assert v["endpoint_loss"] == pytest.approx(ref, abs=1e-4)
    report = (out / "report.md").read_text()
    assert "Learned-matching budget" in report and "Training budget" in report
    assert all(k in report for k in ABLATIONS)


def _train_lm(out, seed, hidden=32):
    run_cli("train", "--model", "gpt-neox-tiny", "--dataset", "austen", "-m", f"hidden_size={hidden}",
            "-m", "num_hidden_layers=1", "-m", "num_attention_heads=2", "-m", "intermediate_size=64",
            "--dataset-arg", "vocab_size=512", "--dataset-arg", "context_length=32", "--limit-train", "64",
            "--epochs", "1", "--optimizer", "adamw", "--lr", "3e-3", "--batch-size", "16", "--seed", str(seed),
            "--out", out)
    return out


def test_align_dual_writes_reloadable_function_preserving_endpoints(tmp_path):
    from modeconn.io import load_checkpoint, load_state_dict
    from modeconn.symmetry import load_absorbed

    a, b = _train_lm(tmp_path / "a", 0), _train_lm(tmp_path / "b", 1)
    out = tmp_path / "aligned"
    run_cli("align", a, b, "--method", "dual", "--steps", "5", "--limit-train", "64", "--out", out)
    assert {"a", "b", "transforms.safetensors", "alignment.json"} <= {p.name for p in out.iterdir()}
    rec = json.loads((out / "alignment.json").read_text())
    assert rec["method"] == "dual" and rec["options"]["steps"] == 5
    transforms = load_state_dict(out / "transforms.safetensors")
    assert {k.split(".")[0] for k in transforms} == {"a", "b"}
    x = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    for side, ckpt in (("a", a), ("b", b)):
        model, _ = load_checkpoint(ckpt)
        with torch.no_grad():
            ref = model.eval()(x)
            got = load_absorbed(out / side).eval()(input_ids=x).logits
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)

    # errors before any heavy work
    res = run_cli("align", a, b, "--method", "dual", "--lambda-value", "1.5", "--out", tmp_path / "x", ok=False)
    assert res.exit_code == 2 and "[0, 1]" in res.output
    res = run_cli("align", a, b, "--method", "bogus", "--out", tmp_path / "x", ok=False)
    assert res.exit_code == 2 and "bogus" in res.output
    c = _train_lm(tmp_path / "c", 2, hidden=16)
    res = run_cli("align", a, c, "--method", "dual", "--out", tmp_path / "x", ok=False)
    assert res.exit_code == 2 and "hidden_size" in res.output
    run_cli("align", a, b, "--method", "learned", "--steps", "3", "--limit-train", "64", "--out", tmp_path / "one")
    assert json.loads((tmp_path / "one" / "alignment.json").read_text())["one_sided"] is True


def test_a_size_runs_only_its_ablations_and_rejects_unknown_ones(monkeypatch):
    from dataclasses import replace
    from types import SimpleNamespace

    from modeconn.errors import ConfigError
    from modeconn.experiments import lmc_dm

    seen = {}
    monkeypatch.setattr(lmc_dm, "dm_barriers", lambda *a, **k: seen.update(k) or ({}, {}, {}))
    bundle = SimpleNamespace(train=None, test=list(range(4)))
    large = lmc_dm.SIZES["large"]
    lmc_dm.lm_dm_barriers(large, bundle, [None, None], print)
    assert list(seen["ablations"]) == list(large.ablations)
    assert {"dual without QK", "dual without OV", "dual without residual rotation"} <= set(large.ablations)
    assert "dual (matrix_exp)" not in seen["ablations"]
    lmc_dm.lm_dm_barriers(lmc_dm.SIZES["full"], bundle, [None, None], print)
    assert list(seen["ablations"]) == list(lmc_dm.ABLATIONS)  # the default: every ablation
    with pytest.raises(ConfigError, match="dual without LayerNorm"):
        replace(large, ablations=("dual without LayerNorm",))
