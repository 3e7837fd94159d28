"""The command line, through typer's test runner, on real data (digits bundled, MNIST from shared data)."""

from __future__ import annotations

import json
import pickle

import pytest
from cli_runner import run_cli as _run


@pytest.fixture(scope="module")
def digits_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    for name, seed in (("a", 0), ("b", 1)):
        _run("train", "--out", root / name, "--dataset", "digits", "--epochs", "3", "--seed", seed,
             "-m", "width=64", "-m", "depth=2", "--batch-size", "64")
    return root


def test_help_is_complete():
    res = _run("--help")
    for cmd in ("demo", "train", "align", "barrier", "merge"):
        assert cmd in res.output
        sub = _run(cmd, "--help")
        assert "--help" in sub.output and len(sub.output) > 200


@pytest.mark.slow
def test_demo_writes_report(tmp_path):
    out = tmp_path / "demo"
    res = _run("demo", "--out", out, "--epochs", "3")
    assert str(out.resolve()) in res.output
    for f in ("results.json", "report.md", "barrier.png", "models/A/config.json", "models/B/model.safetensors"):
        assert (out / f).exists(), f
    results = json.loads((out / "results.json").read_text())
    assert set(results["barriers"]) == {"naive", "weight", "activation"}
    assert "barrier_mean" in (out / "report.md").read_text()
    again = _run("demo", "--out", out, "--epochs", "1", ok=False)
    assert again.exit_code != 0 and "exists and is not empty" in again.output
    assert json.loads((out / "results.json").read_text()) == results, "an existing --out is never overwritten"


def test_train_barrier_align_merge(digits_pair, tmp_path):
    a, b = digits_pair / "a", digits_pair / "b"
    res = _run("barrier", a, b, "--lambdas", "5", "--out", tmp_path / "bar", "--method", "naive", "--method", "weight")
    assert "weight matching" in res.output
    results = json.loads((tmp_path / "bar" / "results.json").read_text())
    assert set(results["barriers"]) == {"naive", "weight"}
    assert results["barriers"]["weight"]["test"]["barrier_mean_loss"] < results["barriers"]["naive"]["test"]["barrier_mean_loss"]
    _run("align", a, b, "--out", tmp_path / "b_aligned", "--method", "activation")
    assert (tmp_path / "b_aligned" / "alignment.json").exists()
    res = _run("merge", a, b, "--out", tmp_path / "merged", "--bn", "repair")
    assert "merged model: test acc" in res.output
    cfg = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert cfg["merged_from"] == [a.name, b.name] and cfg["bn"] == "repair"  # names, never machine paths


def test_bad_inputs_are_clear(digits_pair, tmp_path):
    a, b = digits_pair / "a", digits_pair / "b"
    res = _run("train", "--out", tmp_path / "x", "--dataset", "mnsit", ok=False)
    assert "unknown dataset 'mnsit'" in res.output and "mnist" in res.output
    res = _run("train", "--out", tmp_path / "x", "--model", "resnet", ok=False)
    assert "resnet20" in res.output
    res = _run("train", "--out", tmp_path / "x", "-m", "widht=3", ok=False)
    assert "widht" in res.output
    res = _run("barrier", a, b, "--method", "wieght", ok=False)
    assert "wieght" in res.output and "weight" in res.output
    res = _run("barrier", a, b, "--bn", "rest", ok=False)
    assert "unknown bn policy" in res.output
    res = _run("merge", a, b, "--align", "dual", "--out", tmp_path / "d", ok=False)
    assert "merges Hugging Face causal LMs and ViT" in res.output and not (tmp_path / "d").exists()
    res = _run("barrier", a, tmp_path / "nope", ok=False)
    assert "nope" in res.output
    pick = tmp_path / "pick"
    pick.mkdir()
    (pick / "config.json").write_text((a / "config.json").read_text())
    (pick / "pytorch_model.bin").write_bytes(pickle.dumps({"x": 1}))
    res = _run("barrier", a, pick, ok=False)
    assert "pickle" in res.output.lower()
    res = _run("train", "--out", tmp_path / "m", "--dataset", "mnist", "--data", tmp_path / "empty", ok=False)
    assert "empty" in res.output
