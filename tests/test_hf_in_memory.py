"""Hugging Face causal LMs in memory with the user's text (#31 items 1 and 3): `align --method activation|learned`,
`merge --align activation`, `check` and `eval` on two tiny Llamas with a SentencePiece tokenizer (no tokenizer.json)
and a .jsonl corpus, through the CLI; outputs are stock checkpoints `from_pretrained` loads."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from cli_runner import run_cli
from hf_tiny import randomize
from user_data_fixtures import tiny_causal_lms, tiny_llamas

pytestmark = pytest.mark.usefixtures("one_thread")
T.logging.set_verbosity_error()


@pytest.fixture(scope="module")
def llamas(tmp_path_factory):
    """Two random tiny Llamas sharing a SentencePiece tokenizer.model, and a .jsonl corpus."""
    return tiny_llamas(tmp_path_factory.mktemp("hf-memory"))


def _logits(directory, ids):
    with torch.no_grad():
        return T.AutoModelForCausalLM.from_pretrained(directory).float().eval()(input_ids=ids).logits


@pytest.mark.parametrize("method", ["activation", "learned"])
def test_align_in_memory_writes_a_stock_checkpoint_computing_b(method, llamas, tmp_path):
    dirs, corpus = llamas
    extra = ["--steps", "3"] if method == "learned" else []
    run_cli("align", *dirs, "--method", method, "--dataset", corpus, *extra, "--out", tmp_path / "out")
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_logits(tmp_path / "out", ids), _logits(dirs[1], ids), atol=1e-4, rtol=1e-4)
    record = json.loads((tmp_path / "out" / "alignment.json").read_text())
    assert record["dataset"].startswith("corpus.jsonl")
    assert (tmp_path / "out" / "tokenizer.model").is_file()  # the tokenizer travels with the weights
    moved = T.AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    original = T.AutoModelForCausalLM.from_pretrained(dirs[1]).state_dict()
    assert any(not torch.equal(moved[k], original[k]) for k in original), "no unit was permuted"


def test_merge_align_activation_on_a_corpus_then_eval_and_check(llamas, tmp_path):
    dirs, corpus = llamas
    res = run_cli("merge", *dirs, "--align", "activation", "--dataset", corpus, "--out", tmp_path / "m")
    rec = json.loads((tmp_path / "m" / "merge.json").read_text())
    assert rec["align"] == "activation" and rec["test"]["perplexity"] > 1 and "perplexity" in res.output
    merged = T.AutoModelForCausalLM.from_pretrained(tmp_path / "m")  # a stock checkpoint
    assert type(merged).__name__ == "LlamaForCausalLM"
    run_cli("eval", tmp_path / "m", "--dataset", corpus, "--out", tmp_path / "e")
    assert json.loads((tmp_path / "e" / "results.json").read_text())["test"]["loss"] > 0
    run_cli("check", *dirs, "--dataset", corpus, "--max-batches", "2", "--out", tmp_path / "c")
    assert (tmp_path / "c" / "report.md").is_file()
    # weights 1,0: the merge is model A itself (a wrong alignment direction or weight order would show here)
    run_cli("merge", *dirs, "--align", "activation", "--weights", "1,0", "--dataset", corpus, "--out", tmp_path / "a")
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(_logits(tmp_path / "a", ids), _logits(dirs[0], ids), atol=1e-4, rtol=1e-4)


def test_in_memory_refusals_come_before_any_weights(llamas, tmp_path, monkeypatch):
    from modeconn.checkpoints import Checkpoint

    dirs, corpus = llamas

    def no_load(self):
        raise AssertionError("weights were read before the options were checked")

    monkeypatch.setattr(Checkpoint, "load", no_load)
    cases = [(["align", *dirs, "--method", "activation"], "--dataset"),
             (["merge", *dirs, "--align", "activation", "--dataset", corpus, "--dtype", "float16"], "--dtype"),
             (["merge", *dirs, "--align", "activation", "--dataset", corpus, "--bn", "repair"], "--bn"),
             (["align", *dirs, "--method", "activation", "--dataset", tmp_path / "missing.jsonl"], "missing.jsonl")]
    for args, needle in cases:
        res = run_cli(*args, "--out", tmp_path / "o", ok=False)
        assert res.exit_code == 2 and needle in res.output, (args, res.output)


def test_a_pair_that_does_not_fit_in_memory_is_refused_with_the_size_and_the_streaming_way(llamas, tmp_path,
                                                                                           monkeypatch):
    from modeconn._util import memory
    from modeconn.checkpoints import Checkpoint

    dirs, corpus = llamas
    monkeypatch.setattr(memory, "available_bytes", lambda: 50_000)  # less than the tiny pair's float32 copies

    def no_load(self):
        raise AssertionError("weights were read before the memory check")

    monkeypatch.setattr(Checkpoint, "load", no_load)
    res = run_cli("align", *dirs, "--method", "activation", "--dataset", corpus, "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "GiB" in res.output and "--method weight" in res.output, res.output
    res = run_cli("merge", *dirs, "--align", "activation", "--dataset", corpus, "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "--align weight or none" in res.output, res.output
    monkeypatch.setattr(memory, "available_bytes", lambda: 1 << 40)  # the control: with room, the check passes
    monkeypatch.undo()
    run_cli("align", *dirs, "--method", "activation", "--dataset", corpus, "--out", tmp_path / "ok")


@pytest.fixture(scope="module")
def vits(tmp_path_factory):
    """Two random tiny ViT image classifiers (1 channel, 16×16, classes a/b/c) and an image folder of PNGs whose
    class is a planted brightness pattern."""
    import numpy as np
    from user_data_fixtures import write_pngs

    root = tmp_path_factory.mktemp("hf-vit")
    cfg = T.ViTConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2, image_size=16,
                      patch_size=4, num_channels=1, num_labels=3, id2label={0: "a", 1: "b", 2: "c"},
                      label2id={"a": 0, "b": 1, "c": 2})
    dirs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        d = root / f"vit{seed}"
        randomize(T.ViTForImageClassification(cfg), seed).save_pretrained(d)
        dirs.append(d)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 90)
    images = (rng.random((90, 16, 16)) * 80 + labels[:, None, None] * 80).astype(np.uint8)
    for split, idx in (("train", slice(0, 60)), ("test", slice(60, 90))):
        write_pngs(root / "images" / split, images[idx], labels[idx], ["a", "b", "c"])
    return dirs, root / "images"


def test_image_classifiers_in_memory_on_an_image_folder(vits, tmp_path):
    dirs, images = vits
    run_cli("align", *dirs, "--method", "activation", "--dataset", images, "--out", tmp_path / "al")
    x = torch.rand(2, 1, 16, 16)
    with torch.no_grad():
        got, want = (T.ViTForImageClassification.from_pretrained(d).eval()(pixel_values=x).logits
                     for d in (tmp_path / "al", dirs[1]))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    res = run_cli("merge", *dirs, "--align", "activation", "--dataset", images, "--out", tmp_path / "m")
    assert "accuracy" in res.output and json.loads((tmp_path / "m" / "merge.json").read_text())["test"]["n"] == 30
    run_cli("barrier", *dirs, "--dataset", images, "--method", "naive", "--method", "activation", "--lambdas", "3",
            "--out", tmp_path / "b")
    assert set(json.loads((tmp_path / "b" / "results.json").read_text())["barriers"]) == {"naive", "activation"}
    run_cli("check", *dirs, "--dataset", images, "--max-batches", "1", "--out", tmp_path / "c")
    bad = run_cli("align", *dirs, "--method", "activation", "--dataset", "fashion-mnist", "--out", tmp_path / "x",
                  ok=False)
    assert bad.exit_code == 2 and "image folder" in bad.output


def test_eval_scores_an_image_classifier_on_its_image_folder(vits, tmp_path):
    dirs, images = vits
    run_cli("eval", dirs[0], "--dataset", images, "--out", tmp_path / "e")
    r = json.loads((tmp_path / "e" / "results.json").read_text())
    assert r["test"]["n"] == 30 and 0 <= r["test"]["acc"] <= 1 and "perplexity" not in r["test"]
    bad = run_cli("eval", dirs[0], "--tasks", "x", "--out", tmp_path / "e2", ok=False)
    assert bad.exit_code == 2


@pytest.mark.parametrize("family", ["qwen2", "gpt_neox"])
def test_other_causal_lm_families_align_merge_barrier_check_and_eval(family, tmp_path):
    """The in-memory commands on Qwen2 (Q/K/V biases, GQA) and GPT-NeoX (fused per-head QKV, partial rotary, parallel
    residual) causal LMs with the user's corpus: the aligned B computes B, the merge with weights 1,0 computes A."""
    dirs, corpus = tiny_causal_lms(tmp_path / "lms", family)
    run_cli("align", *dirs, "--method", "activation", "--dataset", corpus, "--out", tmp_path / "out")
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_logits(tmp_path / "out", ids), _logits(dirs[1], ids), atol=1e-4, rtol=1e-4)
    run_cli("merge", *dirs, "--align", "activation", "--weights", "1,0", "--dataset", corpus, "--out", tmp_path / "a")
    torch.testing.assert_close(_logits(tmp_path / "a", ids), _logits(dirs[0], ids), atol=1e-4, rtol=1e-4)
    run_cli("barrier", *dirs, "--dataset", corpus, "--method", "naive", "--method", "activation", "--lambdas", "3",
            "--out", tmp_path / "b")
    run_cli("check", *dirs, "--dataset", corpus, "--max-batches", "1", "--out", tmp_path / "c")
    run_cli("eval", tmp_path / "a", "--dataset", corpus, "--out", tmp_path / "e")
    assert json.loads((tmp_path / "e" / "results.json").read_text())["test"]["perplexity"] > 1


def test_dual_matching_of_vit_classifiers_through_the_cli(vits, tmp_path):
    """`align --method dual` and `merge --align dual` on ViT image classifiers with an image folder: each absorbed
    endpoint computes its checkpoint's logits, barrier reads the endpoints (accuracy along the path), and the merge
    with weights 1,0 computes A."""
    from modeconn.symmetry import load_absorbed

    dirs, images = vits
    run_cli("align", *dirs, "--method", "dual", "--dataset", images, "--steps", "3", "--batch-size", "8",
            "--out", tmp_path / "dual")
    assert json.loads((tmp_path / "dual" / "alignment.json").read_text())["formats"] == {"a": "absorbed",
                                                                                        "b": "absorbed"}
    x = torch.rand(2, 1, 16, 16)
    for side, d in zip("ab", dirs, strict=True):
        with torch.no_grad():
            want = T.ViTForImageClassification.from_pretrained(d).eval()(pixel_values=x).logits
            got = load_absorbed(tmp_path / "dual" / side).eval()(pixel_values=x).logits
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    run_cli("barrier", tmp_path / "dual" / "a", tmp_path / "dual" / "b", "--dataset", images, "--method", "naive",
            "--lambdas", "3", "--out", tmp_path / "b")
    curve = json.loads((tmp_path / "b" / "results.json").read_text())["barriers"]["naive"]["test"]
    assert 0 <= curve["midpoint_acc"] <= 1
    run_cli("eval", tmp_path / "dual" / "b", "--dataset", images, "--out", tmp_path / "e")
    run_cli("eval", dirs[1], "--dataset", images, "--out", tmp_path / "e0")
    scored = [json.loads((tmp_path / d / "results.json").read_text())["test"] for d in ("e", "e0")]
    assert scored[0]["loss"] == pytest.approx(scored[1]["loss"], abs=1e-5)  # dual matching keeps B's function
    run_cli("check", tmp_path / "dual" / "a", tmp_path / "dual" / "b", "--dataset", images, "--max-batches", "1",
            "--out", tmp_path / "c")
    res = run_cli("path", tmp_path / "dual" / "a", tmp_path / "dual" / "b", "--dataset", images, "--method", "linear",
                  "--sub-points", "1", "--out", tmp_path / "p", ok=False)
    assert res.exit_code in (0, 3), res.output
    res = run_cli("merge", *dirs, "--align", "dual", "--dataset", images, "-o", "steps=3", "--weights", "1,0",
                  "--out", tmp_path / "m")
    assert "accuracy" in res.output and "perplexity" not in res.output
    with torch.no_grad():
        want = T.ViTForImageClassification.from_pretrained(dirs[0]).eval()(pixel_values=x).logits
        got = load_absorbed(tmp_path / "m").eval()(pixel_values=x).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
