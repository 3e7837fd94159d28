"""The tutorials run end to end at their quick size (examples/tutorial_*.py, shown in the docs): a user's timm models
and image folder, and a user's Hugging Face causal LMs with a SentencePiece tokenizer and a .jsonl corpus, through the
command line; their outputs are checked."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def _load(name: str):
    if str(EXAMPLES) not in sys.path:  # the tutorials import their shared helpers (examples/cli_helpers.py)
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_timm_tutorial(tmp_path, shared_data, monkeypatch):
    import timm

    monkeypatch.setenv("MODECONN_DATA", str(shared_data))
    results = _load("tutorial_timm_fashion").main(tmp_path, quick=True)
    assert results["check"]["pair"]["relationship"]["name"] and "naive" in results["barrier"]["barriers"]
    assert results["path"]["method"] == "bezier"
    # the aligned B is a timm checkpoint computing B's function; the merge reloads through timm
    x = torch.rand(3, 1, 28, 28)
    b, aligned = (timm.create_model(f"local-dir:{tmp_path / d}", pretrained=True).eval() for d in ("model-b", "b-aligned"))
    with torch.no_grad():
        torch.testing.assert_close(aligned(x), b(x), atol=1e-4, rtol=1e-4)
    merged = timm.create_model(f"local-dir:{tmp_path / 'merged'}", pretrained=True).eval()
    assert merged(x).shape == (3, 10)


def test_hugging_face_tutorial(tmp_path, shared_data, monkeypatch):
    monkeypatch.setenv("MODECONN_DATA", str(shared_data))
    results = _load("tutorial_hf_lms").main(tmp_path, quick=True)
    assert not (tmp_path / "lm-a" / "tokenizer.json").exists() and (tmp_path / "lm-a" / "tokenizer.model").is_file()
    assert {"naive", "weight", "activation"} <= set(results["barrier"]["barriers"])
    ev = results["eval"]
    assert math.isclose(ev["test"]["perplexity"], math.exp(ev["test"]["loss"]), rel_tol=1e-9)
    assert 0 <= ev["lm_eval"]["tasks"]["austen_choice"]["acc"] <= 1
    assert json.loads((tmp_path / "dual" / "alignment.json").read_text())["formats"] == {"a": "stock", "b": "stock"}
    assert results["generated"].startswith("It is a truth universally")


def test_pythia_dual_tutorial(tmp_path, shared_data, monkeypatch):
    """Seed 004's pipeline on checkpoints a user holds: GPT-NeoX pair → check → weight matching (full group) and dual
    matching → barriers on a held-out file → merge --align dual scored on a local lm-eval task → eval → generate."""
    monkeypatch.setenv("MODECONN_DATA", str(shared_data))
    results = _load("tutorial_pythia_dual").main(tmp_path, quick=True)
    assert set(results["barriers"]) == {"naive", "wm", "dual"}
    assert all(math.isfinite(v) for v in results["barriers"].values())
    merge = results["merge"]
    assert merge["align"] == "dual" and merge["format"] == "absorbed"  # LayerNorm family: absorbed, not stock
    assert 0 <= merge["lm_eval"]["tasks"]["austen_next"]["acc"] <= 1
    assert results["eval"]["test"]["loss"] == pytest.approx(merge["test"]["loss"], rel=1e-4)
    assert results["generated"].startswith("It is a truth universally")


def test_vit_dual_tutorial(tmp_path, shared_data, monkeypatch):
    """The vision half of the dual-matching pipeline on checkpoints a user holds: two Hugging Face ViTs trained on
    Fashion-MNIST written as an image folder → check → weight matching (full group) and dual matching → accuracy along
    each path on the held-out images → merge --align dual → eval of the merge."""
    monkeypatch.setenv("MODECONN_DATA", str(shared_data))
    results = _load("tutorial_vit_fashion_dual").main(tmp_path, quick=True)
    paths = results["paths"]
    assert set(paths) == {"naive", "wm", "dual"}
    ends = paths["naive"]["endpoints"]
    for name, p in paths.items():  # every alignment keeps the endpoints' functions: same accuracies at λ = 0 and 1
        assert p["endpoints"] == pytest.approx(ends, abs=0.005), name  # an argmax tie may flip
        assert 0 <= p["min"] <= min(p["endpoints"]) + 1e-9
    assert results["merge"]["align"] == "dual" and results["merge"]["format"] == "absorbed"  # LayerNorm: absorbed
    assert results["eval"]["test"]["loss"] == pytest.approx(results["merge"]["test"]["loss"], rel=1e-4)


def test_moe_merge_example(tmp_path, shared_data, monkeypatch):
    """Two Mixtral-style models trained independently on Austen (stored per expert by save_pretrained): the merge
    after weight matching (experts with their router rows, hidden units per expert) has a lower held-out loss than
    the plain average; both merges load with from_pretrained."""
    monkeypatch.setenv("MODECONN_DATA", str(shared_data))
    loss = _load("moe_merge_austen").main(tmp_path, quick=True)["heldout_loss"]
    assert all(math.isfinite(v) for v in loss.values())
    assert loss["merged-aligned"] < loss["merged-naive"]
    assert json.loads((tmp_path / "merged-aligned" / "merge.json").read_text())["align"] == "weight"
