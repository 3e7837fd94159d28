"""Hugging Face encoders in memory with the user's text: masked LMs on fixed masked blocks of a corpus, sequence
classifiers on labelled texts — align (activation, learned), merge --align activation, barrier, path, check and eval
through the CLI on two tiny BERTs with a WordPiece vocabulary; outputs are stock checkpoints `from_pretrained` loads."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from cli_runner import run_cli
from user_data_fixtures import ENCODER_LABELS, tiny_berts

pytestmark = pytest.mark.usefixtures("one_thread")
T.logging.set_verbosity_error()

AUTO = {"masked_lm": T.AutoModelForMaskedLM, "classifier": T.AutoModelForSequenceClassification}


@pytest.fixture(scope="module", params=["masked_lm", "classifier"])
def berts(request, tmp_path_factory):
    dirs, corpus = tiny_berts(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, dirs, corpus


def _logits(head, directory, ids):
    with torch.no_grad():
        return AUTO[head].from_pretrained(directory).float().eval()(input_ids=ids).logits


def _ids():
    return torch.cat([torch.full((2, 1), 2), torch.randint(5, 28, (2, 10), generator=torch.Generator().manual_seed(0)),
                      torch.full((2, 1), 3)], dim=1)


@pytest.mark.parametrize("method", ["activation", "learned"])
def test_align_an_encoder_writes_a_stock_checkpoint_computing_b(method, berts, tmp_path):
    head, dirs, corpus = berts
    extra = ["--steps", "2"] if method == "learned" else []
    run_cli("align", *dirs, "--method", method, "--dataset", corpus, *extra, "--out", tmp_path / "out")
    torch.testing.assert_close(_logits(head, tmp_path / "out", _ids()), _logits(head, dirs[1], _ids()), atol=1e-4,
                               rtol=1e-4)
    assert (tmp_path / "out" / "vocab.txt").is_file()  # the tokenizer travels with the weights
    moved = AUTO[head].from_pretrained(tmp_path / "out").state_dict()
    original = AUTO[head].from_pretrained(dirs[1]).state_dict()
    assert any(not torch.equal(moved[k], original[k]) for k in original), "no unit was permuted"


def test_merge_barrier_check_eval_and_path_on_an_encoder(berts, tmp_path):
    head, dirs, corpus = berts
    res = run_cli("merge", *dirs, "--align", "activation", "--dataset", corpus, "--out", tmp_path / "m")
    rec = json.loads((tmp_path / "m" / "merge.json").read_text())
    assert rec["align"] == "activation" and rec["test"]["loss"] > 0
    assert ("perplexity" in res.output) == (head == "masked_lm"), res.output
    run_cli("eval", tmp_path / "m", "--dataset", corpus, "--out", tmp_path / "e")
    scored = json.loads((tmp_path / "e" / "results.json").read_text())["test"]
    assert scored["loss"] == pytest.approx(rec["test"]["loss"], rel=1e-5)  # eval reads the same held-out split
    run_cli("barrier", *dirs, "--dataset", corpus, "--method", "naive", "--method", "activation", "--lambdas", "3",
            "--out", tmp_path / "b")
    assert "activation" in json.loads((tmp_path / "b" / "results.json").read_text())["methods"]
    run_cli("check", *dirs, "--dataset", corpus, "--max-batches", "1", "--out", tmp_path / "c")
    assert (tmp_path / "c" / "report.md").is_file()
    res = run_cli("path", *dirs, "--dataset", corpus, "--method", "linear", "--eval-limit", "4", "--sub-points", "1",
                  "--out", tmp_path / "p", ok=False)
    assert res.exit_code in (0, 3), res.output  # 3: an incomplete path, still reported
    # weights 1,0: the merge is model A itself (a wrong alignment direction or weight order would show here)
    run_cli("merge", *dirs, "--align", "activation", "--weights", "1,0", "--dataset", corpus, "--out", tmp_path / "a")
    torch.testing.assert_close(_logits(head, tmp_path / "a", _ids()), _logits(head, dirs[0], _ids()), atol=1e-4,
                               rtol=1e-4)


def test_masked_lm_loss_is_over_the_masked_tokens_only(tmp_path):
    """The bundle's labels are -100 except at the masked positions, and the loss eval reports is the cross-entropy
    of those positions alone (counting the unmasked ones, as a broken flatten would, changes it)."""
    import torch.nn.functional as F

    from modeconn.checkpoints import open_checkpoints
    from modeconn.data import make_loader
    from modeconn.nn_utils import flatten_sequence_logits
    from modeconn.path import evaluate_model
    from modeconn.recipes.hf_memory import load_models

    dirs, corpus = tiny_berts(tmp_path, "masked_lm")
    (ma, _), bundle = load_models(open_checkpoints(dirs), "eval", str(corpus), None, None)
    x, y = bundle.test.tensors
    masked = y != -100
    assert 0.1 < masked.float().mean() < 0.2 and bool((x[masked] == 4).all())  # [MASK] is id 4
    assert bool((x[:, 0] == 2).all()) and bool((x[:, -1] == 3).all())  # [CLS] … [SEP] never masked
    scored = evaluate_model(ma, make_loader(bundle.test, 4))
    with torch.no_grad():
        logits = ma(x)
    assert scored["n"] == int(masked.sum())
    assert scored["loss"] == pytest.approx(float(F.cross_entropy(logits[masked], y[masked])), rel=1e-5)
    everywhere = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.where(masked, y, x).reshape(-1))
    assert abs(float(everywhere) - scored["loss"]) > 1e-3
    kept, labels = flatten_sequence_logits(logits, y)
    assert kept.shape[0] == int(masked.sum()) and bool((labels != -100).all())


def test_labels_are_read_by_name_or_index_and_bad_ones_are_refused(tmp_path):
    dirs, corpus = tiny_berts(tmp_path, "classifier")
    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    by_index = tmp_path / "by_index.jsonl"
    by_index.write_text("\n".join(json.dumps({"sentence": r["text"], "y": ENCODER_LABELS.index(r["label"])})
                                  for r in rows))
    run_cli("eval", dirs[0], "--dataset", corpus, "--out", tmp_path / "names")
    run_cli("eval", dirs[0], "--dataset", by_index, "--text-field", "sentence", "--label-field", "y",
            "--out", tmp_path / "index")
    names, index = (json.loads((tmp_path / d / "results.json").read_text())["test"] for d in ("names", "index"))
    assert names == index  # a class name and its index are the same label
    bad = tmp_path / "bad.jsonl"
    bad.write_text(corpus.read_text() + "\n" + json.dumps({"text": "the fox", "label": "angry"}))
    res = run_cli("eval", dirs[0], "--dataset", bad, "--out", tmp_path / "x", ok=False)
    assert res.exit_code == 2 and "'angry'" in res.output and "calm" in res.output, res.output
    res = run_cli("eval", dirs[0], "--dataset", by_index, "--text-field", "sentence", "--out", tmp_path / "y", ok=False)
    assert res.exit_code == 2 and "'label'" in res.output and "--label-field" in res.output, res.output
    res = run_cli("eval", dirs[0], "--dataset", "austen", "--out", tmp_path / "z", ok=False)
    assert res.exit_code == 2 and "labelled texts" in res.output, res.output
