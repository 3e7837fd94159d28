"""#31 item 2 through the command line: `modeconn barrier A B --dataset corpus.jsonl` on two tiny Hugging Face Llamas
with a SentencePiece tokenizer (no tokenizer.json), and modeconn checkpoints on an image folder of Fashion-MNIST PNGs
(barrier, check, merge); bad data and a missing path are refused before any model work."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers as T

import modeconn.data
from cli_runner import run_cli
from user_data_fixtures import tiny_llamas, write_pngs

T.logging.set_verbosity_error()


@pytest.fixture(scope="module")
def llamas(tmp_path_factory):
    """Two random tiny Llamas sharing a SentencePiece tokenizer.model, and a .jsonl corpus."""
    return tiny_llamas(tmp_path_factory.mktemp("llamas"))


def test_barrier_on_a_jsonl_corpus_with_a_sentencepiece_tokenizer(llamas, tmp_path):
    dirs, corpus = llamas
    run_cli("barrier", *dirs, "--dataset", corpus, "--method", "naive", "--method", "weight", "--lambdas", "3",
            "--context-length", "16", "--seed", "3", "--out", tmp_path / "out")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["dataset"]["name"] == "corpus.jsonl (16-token blocks, held out: 0.1 of the blocks, seed 3)"
    assert set(results["barriers"]) == {"naive", "weight"}
    assert all(np.isfinite(v["test"]["barrier_mean_loss"]) for v in results["barriers"].values())
    # the endpoint's loss is model A's own next-token loss on those blocks (not some other data or tokenization)
    from modeconn.data import UserDataOptions, user_data_for_checkpoint

    bundle = user_data_for_checkpoint(dirs[0], json.loads((dirs[0] / "config.json").read_text()), corpus,
                                      options=UserDataOptions(context_length=16, seed=3))
    x, y = bundle.test.tensors
    with torch.no_grad():
        logits = T.LlamaForCausalLM.from_pretrained(dirs[0]).float().eval()(x).logits
    want = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
    assert results["endpoints"]["A"]["loss"] == pytest.approx(want, rel=1e-4)


def test_path_on_a_jsonl_corpus(llamas, tmp_path):
    dirs, corpus = llamas
    res = run_cli("path", *dirs, "--dataset", corpus, "--method", "linear", "--context-length", "8", "--eval-limit", "4",
                  "--sub-points", "1", "--out", tmp_path / "p", ok=False)
    assert res.exit_code in (0, 3), res.output  # 3: an incomplete path, still reported
    assert "8-token blocks" in (tmp_path / "p" / "results.json").read_text()


def _missing_path_refused(dirs, tmp_path) -> None:
    res = run_cli("barrier", *dirs, "--dataset", "missing.jsonl", "--out", tmp_path / "m", ok=False)
    assert res.exit_code == 2 and "missing.jsonl" in res.output and "no such file" in res.output, res.output


def test_bad_data_and_a_missing_path_are_refused(llamas, tmp_path, monkeypatch):
    dirs, corpus = llamas
    _missing_path_refused(dirs, tmp_path)
    res = run_cli("barrier", *dirs, "--dataset", corpus, "--text-field", "body", "--out", tmp_path / "f", ok=False)
    assert res.exit_code == 2 and "no field 'body'" in res.output and "fields present: text, n" in res.output
    res = run_cli("barrier", *dirs, "--dataset", corpus, "--context-length", "64", "--out", tmp_path / "c", ok=False)
    assert res.exit_code == 2 and "longer than the model's positions" in res.output
    res = run_cli("barrier", *dirs, "--dataset", "austen", "--split", "test", "--out", tmp_path / "s", ok=False)
    assert res.exit_code == 2 and "--split apply to your own data" in res.output
    # negative control: a resolver that falls back to names for a missing path fails the check above
    monkeypatch.setattr(modeconn.data, "user_data_path", lambda v: Path(v) if v and Path(v).exists() else None)
    with pytest.raises(AssertionError):
        _missing_path_refused(dirs, tmp_path)


# ------------------------------------------------------------------------------------------------ images
@pytest.fixture(scope="module")
def fashion_folder(tmp_path_factory):
    """Two modeconn MLPs for Fashion-MNIST's (1, 28, 28) and 60 of its images as PNG class folders 0…9."""
    from modeconn.data import load_dataset
    from modeconn.io import save_checkpoint
    from modeconn.models import build_model

    root = tmp_path_factory.mktemp("fashion")
    ref = load_dataset("fashion-mnist", limit_train=60)
    x, y = ref.train.tensors
    raw = np.rint((x[:, 0].numpy() * 0.3530 + 0.2860) * 255).clip(0, 255).astype(np.uint8)
    folder = write_pngs(root / "images", raw, y.numpy(), [str(i) for i in range(10)])
    ckpts = [save_checkpoint(root / f"m{s}", build_model("mlp", in_shape=(1, 28, 28), num_classes=10, depth=1,
                                                         width=16, seed=s), config={"dataset": "fashion-mnist"})
             for s in (0, 1)]
    return ckpts, folder, x


def test_modeconn_checkpoints_on_an_image_folder(fashion_folder, tmp_path):
    from modeconn.data import user_data_for_checkpoint

    ckpts, folder, x = fashion_folder
    config = json.loads((ckpts[0] / "config.json").read_text())
    bundle = user_data_for_checkpoint(None, config, folder, input_shape=(1, 28, 28))
    got = torch.cat([bundle.train.tensors[0], bundle.test.tensors[0]])
    assert got.shape == x.shape and torch.allclose(got.sum(0), x.sum(0), atol=1e-3)  # the recorded normalisation
    run_cli("barrier", *ckpts, "--dataset", folder, "--method", "naive", "--method", "activation", "--lambdas", "3",
            "--out", tmp_path / "b")
    results = json.loads((tmp_path / "b" / "results.json").read_text())
    assert results["dataset"]["name"] == ("images (held out: 0.1 of the images, seed 0; preprocessing: [0, 1] pixels "
                                          "at their own size, normalised with mean (0.286,) / std (0.353,))")
    run_cli("check", *ckpts, "--dataset", folder, "--out", tmp_path / "c")
    run_cli("merge", *ckpts, "--align", "activation", "--dataset", folder, "--out", tmp_path / "m")
    res = run_cli("barrier", *ckpts, "--dataset", folder, "--context-length", "8", "--out", tmp_path / "x", ok=False)
    assert res.exit_code == 2 and "apply to text corpora" in res.output


def test_image_folder_disagreeing_with_the_head_is_refused(fashion_folder, tmp_path):
    ckpts, folder, _ = fashion_folder
    nine = tmp_path / "nine"
    shutil.copytree(folder, nine)
    shutil.rmtree(nine / "9")
    res = run_cli("barrier", *ckpts, "--dataset", nine, "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "9 class folders (0, 1, 2, 3, 4, 5, 6, 7, 8)" in res.output
    assert "config.json kwargs.num_classes = 10" in res.output


def test_train_on_an_image_folder_then_barrier_on_the_recorded_folder(fashion_folder, tmp_path):
    _, folder, _ = fashion_folder
    outs = [tmp_path / f"t{s}" for s in (0, 1)]
    for s, out in enumerate(outs):
        run_cli("train", "--model", "mlp", "-m", "depth=1", "-m", "width=8", "--dataset", folder, "--epochs", "1",
                "--seed", s, "--out", out)
    config = json.loads((outs[0] / "config.json").read_text())
    assert config["dataset"] == str(folder.resolve()) and config["kwargs"]["num_classes"] == 10
    run_cli("barrier", *outs, "--method", "naive", "--lambdas", "3", "--out", tmp_path / "b")  # the recorded folder
    assert "images (held out" in (tmp_path / "b" / "results.json").read_text()
    run_cli("merge", *outs, "--align", "activation", "--out", tmp_path / "m")  # the recorded folder, checked as named
