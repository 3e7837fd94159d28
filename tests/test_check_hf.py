"""`modeconn check` on Hugging Face causal LMs: text from --dataset tokenized with the checkpoint's own tokenizer, the
same report as for modeconn checkpoints; a planted permuted copy is recognised as one."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from cli_runner import run_cli

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 300


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory, shared_data):
    """A random Llama LM, an independent one, and a copy of the first under a random permutation element."""
    from hf_tiny import randomize

    from modeconn.data import train_tokenizer
    from modeconn.data.text import read_text_file
    from modeconn.symmetry import hf_symmetry_spec
    from modeconn.symmetry.selfcheck import moving_element

    root = tmp_path_factory.mktemp("check-hf")
    tok = train_tokenizer(read_text_file(shared_data / "austen" / "austen.txt.gz", None)[:200_000], VOCAB)
    cfg = T.LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                        num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=0)
    models = {}
    for name, seed in (("a", 0), ("other", 1)):
        torch.manual_seed(seed)
        models[name] = randomize(T.LlamaForCausalLM(cfg), seed)
    spec = hf_symmetry_spec(models["a"])
    models["permuted"] = T.LlamaForCausalLM(cfg)
    models["permuted"].load_state_dict(spec.apply(models["a"].state_dict(), moving_element(spec, 0)))
    for name, m in models.items():
        m.save_pretrained(root / name)
        (root / name / "tokenizer.json").write_text(tok.to_str())
    return root


def _results(out):
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_check_reads_hugging_face_causal_lms_and_recognises_a_permuted_copy(llama_pair, tmp_path):
    root = llama_pair
    common = ["--dataset", "austen", "--limit-train", "64", "--max-batches", "2", "--eval-limit", "16"]
    res = run_cli("check", root / "a", root / "permuted", *common, "--out", tmp_path / "planted")
    planted = _results(tmp_path / "planted")
    assert planted["dataset"] == "austen" and (tmp_path / "planted" / "report.md").is_file() and "check" in res.output
    res_space = planted["pair"]["spaces"]["residual"]
    assert res_space["q_weight"] > 0.99 and res_space["q_identity"] < 0.5, res_space
    run_cli("check", root / "a", root / "other", *common, "--out", tmp_path / "independent")
    independent = _results(tmp_path / "independent")["pair"]["spaces"]["residual"]
    assert independent["q_weight"] < 0.9, independent  # the control: two independent models are not one permuted
    run_cli("check", root / "a", *common, "--out", tmp_path / "alone")
    assert (tmp_path / "alone" / "check.png").is_file()


def test_check_refuses_what_it_cannot_read_before_loading(llama_pair, tmp_path, monkeypatch):
    from modeconn.checkpoints import Checkpoint

    def no_load(self):
        raise AssertionError("weights were read before the options were checked")

    monkeypatch.setattr(Checkpoint, "load", no_load)
    for args, needle in (([], "--dataset austen"), (["--dataset", "digits"], "--dataset austen")):
        res = run_cli("check", llama_pair / "a", llama_pair / "other", *args, "--out", tmp_path / "o", ok=False)
        assert res.exit_code == 2 and needle in res.output, res.output
