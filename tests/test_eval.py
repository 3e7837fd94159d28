"""`modeconn eval`: loss / perplexity on a dataset's test split and lm-evaluation-harness scores of a causal LM,
offline (local YAML tasks over local .jsonl files); the same scores through modeconn as through lm-eval's own entry
point; every refusal before any weights are read."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
import transformers as T
from cli_runner import run_cli

from modeconn.diagnostics.harness import _scores
from modeconn.errors import NonFiniteError

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 300

MC_TASK = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {file}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
  - metric: acc_norm
"""
PPL_TASK = """task: tiny_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {file}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: "{{{{text}}}}"
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory, shared_data):
    """A tiny GPT-NeoX causal LM with its own BPE tokenizer (trained on Austen), saved with save_pretrained."""
    from modeconn.data import train_tokenizer
    from modeconn.data.text import read_text_file

    from hf_tiny import randomize

    root = tmp_path_factory.mktemp("eval")
    tok = train_tokenizer(read_text_file(shared_data / "austen" / "austen.txt.gz", None)[:200_000], VOCAB)
    fast = T.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=tok.id_to_token(0), pad_token=tok.id_to_token(0))
    cfg = T.GPTNeoXConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
                          vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    d = root / "lm"
    randomize(T.GPTNeoXForCausalLM(cfg), 0).save_pretrained(d)
    fast.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    mc = [{"question": "Elizabeth was", "choices": [" happy", " a house", " of"], "label": 0},
          {"question": "Mr. Darcy", "choices": [" said", " the the", " and"], "label": 0},
          {"question": "She could not", "choices": [" help", " Emma", " very"], "label": 0}] * 3
    ppl = [{"text": "It is a truth universally acknowledged, that a single man in possession of a good fortune."},
           {"text": "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition."}]
    for name, rows in (("mc.jsonl", mc), ("ppl.jsonl", ppl)):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "tiny_mc.yaml").write_text(MC_TASK.format(file=root / "mc.jsonl"))
    (root / "tiny_ppl.yaml").write_text(PPL_TASK.format(file=root / "ppl.jsonl"))
    return root


def _results(out):
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_lm_eval_scores_through_modeconn_equal_lm_evals_own_entry_point(lm_dir, tasks_dir, tmp_path):
    res = run_cli("eval", lm_dir, "--tasks", "tiny_mc,tiny_ppl", "--include-path", tasks_dir, "--batch-size", "4",
                  "--out", tmp_path / "ours")
    ours = _results(tmp_path / "ours")["lm_eval"]["tasks"]
    assert set(ours) == {"tiny_mc", "tiny_ppl"} and "lm-eval tiny_ppl" in res.output
    assert {"acc", "acc_norm"} <= set(ours["tiny_mc"]) and {"word_perplexity", "bits_per_byte"} <= set(ours["tiny_ppl"])
    proc = subprocess.run(
        [sys.executable, "-m", "lm_eval", "run", "--model", "hf", "--model_args", f"pretrained={lm_dir},dtype=float32",
         "--device", "cpu", "--tasks", "tiny_mc,tiny_ppl", "--include_path", str(tasks_dir), "--batch_size", "4",
         "--output_path", str(tmp_path / "theirs")],
        capture_output=True, text=True, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
        timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(next((tmp_path / "theirs").rglob("results_*.json")).read_text())["results"]
    for task, scores in ours.items():
        for metric, value in scores.items():
            if "stderr" not in metric:
                assert value == pytest.approx(theirs[task][f"{metric},none"], rel=1e-5, abs=1e-6), (task, metric)


@pytest.mark.slow
def test_perplexity_on_a_text_dataset_is_exact_for_a_uniform_model(lm_dir, tmp_path):
    """With the output head zeroed every logit is 0: the loss must be ln V and the perplexity V exactly — a
    mis-shifted label, a wrong reduction or a token count off by one shows here."""
    import shutil

    uniform = tmp_path / "uniform"
    shutil.copytree(lm_dir, uniform)
    model = T.GPTNeoXForCausalLM.from_pretrained(uniform)
    with torch.no_grad():
        model.get_output_embeddings().weight.zero_()
    model.save_pretrained(uniform)
    run_cli("eval", uniform, "--dataset", "austen", "--eval-limit", "4", "--out", tmp_path / "u")
    test = _results(tmp_path / "u")["test"]
    assert test["loss"] == pytest.approx(math.log(VOCAB), rel=1e-6)
    assert test["perplexity"] == pytest.approx(VOCAB, rel=1e-5) and test["n"] == 4 * 64
    run_cli("eval", lm_dir, "--dataset", "austen", "--eval-limit", "4", "--out", tmp_path / "r")
    trained_like = _results(tmp_path / "r")["test"]
    assert trained_like["loss"] != pytest.approx(math.log(VOCAB), rel=1e-3)  # the control: a real model differs


def test_a_modeconn_checkpoint_is_scored_on_its_recorded_dataset(tmp_path):
    run_cli("train", "--out", tmp_path / "m", "--dataset", "digits", "--epochs", "3", "-m", "width=16", "-m", "depth=1")
    res = run_cli("eval", tmp_path / "m", "--out", tmp_path / "e")
    r = _results(tmp_path / "e")
    assert r["dataset"]["name"] == "digits" and 0.5 < r["test"]["acc"] <= 1.0 and r["test"]["n"] > 0
    assert "perplexity" not in r["test"] and "digits test" in res.output
    from modeconn.data import load_dataset
    from modeconn.io import load_checkpoint

    model = load_checkpoint(tmp_path / "m")[0].eval()
    x, y = load_dataset("digits").test.tensors[:2]
    with torch.no_grad():
        logits = model(x)
    assert r["test"]["acc"] == int((logits.argmax(1) == y).sum()) / len(y)
    assert r["test"]["loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(logits, y)), rel=1e-5)
    bad = run_cli("eval", tmp_path / "m", "--tasks", "tiny_mc", "--out", tmp_path / "e2", ok=False)
    assert bad.exit_code == 2 and ("unknown lm-eval task" in bad.output or "Hugging Face causal LMs" in bad.output)


def test_refusals_come_before_any_weights_are_read(lm_dir, tasks_dir, tmp_path, monkeypatch):
    from modeconn.checkpoints import Checkpoint

    def no_load(self):
        raise AssertionError("weights were read before the options were checked")

    monkeypatch.setattr(Checkpoint, "load", no_load)
    cases = [
        (["--tasks", "no_such_task", "--include-path", tasks_dir], "'no_such_task'"),
        (["--tasks", "tiny_mc", "--include-path", tmp_path / "missing"], "not a directory"),
        (["--limit", "5"], "--limit applies to lm-eval tasks"),
        ([], "pass --dataset"),
        (["--dataset", "digits"], "--dataset austen"),
    ]
    for args, needle in cases:
        res = run_cli("eval", lm_dir, *args, "--out", tmp_path / "o", ok=False)
        assert res.exit_code == 2 and needle in res.output, (args, res.output)
    assert not (tmp_path / "o").exists()


def test_a_non_finite_score_is_an_error_not_a_result():
    assert _scores({"acc,none": 0.5, "acc_stderr,none": "N/A", "alias": "t"}, "t") == {"acc": 0.5}
    with pytest.raises(NonFiniteError, match="'word_perplexity'"):
        _scores({"word_perplexity,none": float("inf")}, "t")
    with pytest.raises(NonFiniteError, match="'acc'"):
        _scores({"acc,none": float("nan")}, "t")


@pytest.mark.slow
def test_merge_eval_scores_the_written_merge_into_merge_json_and_the_card(lm_dir, tasks_dir, tmp_path):
    """`merge --eval TASKS`: the merge as written is scored (the same scores `eval --tasks` gives on it), and the
    scores are in merge.json and the model card."""
    import shutil

    from hf_tiny import randomize

    other = tmp_path / "other"
    shutil.copytree(lm_dir, other)
    randomize(T.GPTNeoXForCausalLM.from_pretrained(other), 1).save_pretrained(other)
    res = run_cli("merge", lm_dir, other, "--align", "none", "--eval", "tiny_mc", "--include-path", tasks_dir,
                  "--out", tmp_path / "m")
    assert "lm-eval tiny_mc" in res.output
    scores = json.loads((tmp_path / "m" / "merge.json").read_text())["lm_eval"]["tasks"]["tiny_mc"]
    assert "lm-eval tiny\\_mc: acc" in (tmp_path / "m" / "README.md").read_text()
    run_cli("eval", tmp_path / "m", "--tasks", "tiny_mc", "--include-path", tasks_dir, "--out", tmp_path / "e")
    assert _results(tmp_path / "e")["lm_eval"]["tasks"]["tiny_mc"] == pytest.approx(scores)


def test_merge_eval_is_refused_before_any_work_where_it_cannot_apply(lm_dir, tasks_dir, tmp_path):
    run_cli("train", "--out", tmp_path / "m", "--dataset", "digits", "--epochs", "1", "-m", "width=8", "-m", "depth=1")
    res = run_cli("merge", tmp_path / "m", tmp_path / "m", "--eval", "tiny_mc", "--include-path", tasks_dir,
                  "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "causal LMs" in res.output and not (tmp_path / "o").exists(), res.output
    res = run_cli("merge", lm_dir, lm_dir, "--align", "none", "--eval", "no_such_task", "--include-path", tasks_dir,
                  "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "no_such_task" in res.output and not (tmp_path / "o").exists(), res.output
    res = run_cli("merge", lm_dir, lm_dir, "--align", "none", "--include-path", tasks_dir, "--out", tmp_path / "o",
                  ok=False)
    assert res.exit_code == 2 and "--include-path" in res.output and "--eval" in res.output, res.output


@pytest.mark.slow
def test_barrier_eval_scores_a_b_and_the_midpoint_merge(lm_dir, tasks_dir, tmp_path):
    """`barrier --eval TASKS`: lm-eval scores at A, B and the naive midpoint (the model `merge --align none` writes:
    same scores), each metric's barrier against the endpoints' mean in the direction lm-eval states."""
    import shutil

    from hf_tiny import randomize

    other = tmp_path / "other"
    shutil.copytree(lm_dir, other)
    randomize(T.GPTNeoXForCausalLM.from_pretrained(other), 1).save_pretrained(other)
    res = run_cli("barrier", lm_dir, other, "--method", "naive", "--dataset", "austen", "--limit-train", "64",
                  "--eval-limit", "16", "--lambdas", "3", "--eval", "tiny_mc,tiny_ppl", "--include-path", tasks_dir,
                  "--out", tmp_path / "b")
    record = _results(tmp_path / "b")["lm_eval"]
    assert "lm-eval tiny_mc barrier (naive)" in res.output
    assert set(record["scores"]) == {"A", "B", "midpoint naive"}
    assert record["higher_is_better"]["tiny_mc"]["acc"] and not record["higher_is_better"]["tiny_ppl"]["word_perplexity"]
    run_cli("merge", lm_dir, other, "--align", "none", "--eval", "tiny_mc,tiny_ppl", "--include-path", tasks_dir,
            "--out", tmp_path / "m")
    merged = json.loads((tmp_path / "m" / "merge.json").read_text())["lm_eval"]["tasks"]
    for task, scores in merged.items():
        assert record["scores"]["midpoint naive"][task] == pytest.approx(scores, rel=1e-5)
    s = record["scores"]
    for task, metric, sign in (("tiny_mc", "acc", 1), ("tiny_ppl", "word_perplexity", -1)):
        mean = (s["A"][task][metric] + s["B"][task][metric]) / 2
        assert record["barrier"]["naive"][task][metric] == pytest.approx(sign * (mean - s["midpoint naive"][task][metric]))
    assert "| naive | tiny_ppl | word_perplexity |" in (tmp_path / "b" / "report.md").read_text()


def test_barrier_eval_is_refused_before_any_work_where_it_cannot_apply(lm_dir, tasks_dir, tmp_path):
    run_cli("train", "--out", tmp_path / "m", "--dataset", "digits", "--epochs", "1", "-m", "width=8", "-m", "depth=1")
    res = run_cli("barrier", tmp_path / "m", tmp_path / "m", "--eval", "tiny_mc", "--include-path", tasks_dir,
                  "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "causal LMs" in res.output and not (tmp_path / "o").exists(), res.output
    res = run_cli("barrier", lm_dir, lm_dir, "--dataset", "austen", "--eval", "no_such_task", "--include-path",
                  tasks_dir, "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "no_such_task" in res.output and not (tmp_path / "o").exists(), res.output
    res = run_cli("barrier", lm_dir, lm_dir, "--dataset", "austen", "--include-path", tasks_dir, "--out",
                  tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "--include-path" in res.output and "--eval" in res.output, res.output
