"""`modeconn align --method dual|one-sided` on Hugging Face causal LMs (LMC-DM on the checkpoints users hold): both
endpoints absorbed and transformed, each written endpoint computing its checkpoint's function; refusals before any
weights are read."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T
from cli_runner import run_cli

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 300
_SIZE = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2, vocab_size=VOCAB,
             max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
FAMILIES = {
    "gpt_neox": lambda: T.GPTNeoXForCausalLM(T.GPTNeoXConfig(rotary_pct=0.5, **_SIZE)),
    "llama": lambda: T.LlamaForCausalLM(T.LlamaConfig(num_key_value_heads=2, **_SIZE)),
}
FORMAT = {"gpt_neox": "absorbed", "llama": "stock"}
"""What the aligned endpoints are written as: RMSNorm families as stock checkpoints, LayerNorm ones absorbed."""


def _load(directory, fmt):
    from modeconn.symmetry import load_absorbed

    if fmt == "stock":
        return T.AutoModelForCausalLM.from_pretrained(directory).eval()
    with pytest.raises(ValueError):  # stock transformers refuses an absorbed checkpoint
        T.AutoModelForCausalLM.from_pretrained(directory)
    return load_absorbed(directory).eval()


@pytest.fixture(scope="module")
def tokenizer(shared_data):
    from modeconn.data import train_tokenizer
    from modeconn.data.text import read_text_file

    return train_tokenizer(read_text_file(shared_data / "austen" / "austen.txt.gz", None)[:200_000], VOCAB)


def _pair(root, family, tokenizer):
    from hf_tiny import randomize

    dirs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        d = root / f"{family}{seed}"
        randomize(FAMILIES[family](), seed).save_pretrained(d)
        (d / "tokenizer.json").write_text(tokenizer.to_str())
        dirs.append(d)
    return dirs


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_dual_matching_of_hugging_face_causal_lms_through_the_cli(family, tokenizer, tmp_path):
    dirs = _pair(tmp_path, family, tokenizer)
    res = run_cli("align", *dirs, "--method", "dual", "--dataset", "austen", "--steps", "3", "--limit-train", "64",
                  "--batch-size", "4", "--out", tmp_path / "out")
    assert "dual matching" in res.output
    record = json.loads((tmp_path / "out" / "alignment.json").read_text())
    assert record["method"] == "dual" and record["options"]["steps"] == 3 and len(record["spaces"]) > 0
    assert record["formats"] == {"a": FORMAT[family], "b": FORMAT[family]}
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    for side, d in zip("ab", dirs, strict=True):
        original = T.AutoModelForCausalLM.from_pretrained(d).eval()
        aligned = _load(tmp_path / "out" / side, FORMAT[family])
        with torch.no_grad():
            ref, got = original(input_ids=ids).logits, aligned(input_ids=ids).logits
        assert (got - ref).abs().max() <= 1e-3 * max(1.0, float(ref.abs().max())), side
        assert FORMAT[family] == "absorbed" or (tmp_path / "out" / side / "tokenizer.json").is_file()
    # the written endpoints are checkpoints the other commands read: B's held-out loss is B's, and the dual-matched
    # pair's barrier is measured by `barrier` on them (naive: they are aligned already)
    run_cli("eval", dirs[1], "--dataset", "austen", "--eval-limit", "4", "--out", tmp_path / "eval-b")
    run_cli("eval", tmp_path / "out" / "b", "--dataset", "austen", "--eval-limit", "4", "--out", tmp_path / "eval-bb")
    losses = [json.loads((tmp_path / d / "results.json").read_text())["test"]["loss"] for d in ("eval-b", "eval-bb")]
    assert losses[0] == pytest.approx(losses[1], abs=1e-4)
    run_cli("barrier", tmp_path / "out" / "a", tmp_path / "out" / "b", "--dataset", "austen", "--method", "naive",
            "--lambdas", "3", "--eval-limit", "4", "--limit-train", "16", "--out", tmp_path / "barrier")
    assert json.loads((tmp_path / "barrier" / "results.json").read_text())["barriers"]["naive"]
    res = run_cli("path", tmp_path / "out" / "a", tmp_path / "out" / "b", "--dataset", "austen", "--method", "linear",
                  "--eval-limit", "4", "--limit-train", "16", "--sub-points", "1", "--out", tmp_path / "path", ok=False)
    assert res.exit_code in (0, 3) and (tmp_path / "path" / "results.json").is_file(), res.output  # 3: incomplete
    run_cli("check", tmp_path / "out" / "a", tmp_path / "out" / "b", "--dataset", "austen", "--limit-train", "32",
            "--max-batches", "1", "--eval-limit", "4", "--out", tmp_path / "check")
    assert (tmp_path / "check" / "report.md").is_file()

    from modeconn.symmetry import absorb_normalization

    b_absorbed = absorb_normalization(T.AutoModelForCausalLM.from_pretrained(dirs[1]).eval()).state_dict()
    b_out = _load(tmp_path / "out" / "b", FORMAT[family]).state_dict()
    moved = [k for k in b_out if k in b_absorbed and not torch.allclose(b_out[k], b_absorbed[k], atol=1e-5)]
    assert moved, "B was written in its absorbed form unchanged: no transform was applied"


@pytest.mark.slow
def test_one_sided_matching_leaves_a_in_its_absorbed_form(tokenizer, tmp_path):
    dirs = _pair(tmp_path, "gpt_neox", tokenizer)
    run_cli("align", *dirs, "--method", "one-sided", "--dataset", "austen", "--steps", "2", "--limit-train", "32",
            "--batch-size", "4", "--out", tmp_path / "out")
    record = json.loads((tmp_path / "out" / "alignment.json").read_text())
    assert record["one_sided"] is True and record["method"] == "one-sided"


def test_refusals_before_any_weights_are_read(tokenizer, tmp_path, monkeypatch):
    from modeconn.checkpoints import Checkpoint

    dirs = _pair(tmp_path, "gpt_neox", tokenizer)

    def no_load(self):
        raise AssertionError("weights were read before the options were checked")

    monkeypatch.setattr(Checkpoint, "load", no_load)
    cases = [
        (["--dataset", "digits"], "--dataset austen"),
        ([], "--dataset austen"),
        (["--dataset", "austen", "--groups", "full"], "--groups does not apply"),
        (["--dataset", "austen", "--lambda-value", "2"], "--lambda-value must lie in [0, 1]"),
    ]
    for args, needle in cases:
        res = run_cli("align", *dirs, "--method", "dual", *args, "--out", tmp_path / "o", ok=False)
        assert res.exit_code == 2 and needle in res.output, (args, res.output)
    (dirs[0] / "tokenizer.json").unlink()
    res = run_cli("align", *dirs, "--method", "dual", "--dataset", "austen", "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "tokenizer" in res.output
    assert not (tmp_path / "o").exists()


def test_stock_export_only_where_the_family_norm_represents_the_absorbed_model(monkeypatch):
    """RMSNorm (Llama) → a stock model with unit norm weights and the same logits; LayerNorm (GPT-NeoX) → None; and
    the check is what decides: with the norm weights exported wrong (0), the Llama export is refused too."""
    from hf_tiny import make

    from modeconn.symmetry import absorb_normalization, absorb_export

    ids = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(0))
    llama = absorb_normalization(make("llama"))
    stock = absorb_export.stock_model(llama)
    assert stock is not None and type(stock).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        assert torch.allclose(stock(input_ids=ids).logits, llama(input_ids=ids).logits, atol=1e-5)
    assert absorb_export.stock_model(absorb_normalization(make("gpt_neox"))) is None
    monkeypatch.setattr(absorb_export, "_norm_parameters",
                        lambda model, sd: {k: torch.zeros_like(t) for k, t in model.state_dict().items() if k not in sd})
    assert absorb_export.stock_model(llama) is None


@pytest.mark.slow
def test_sharded_two_processes_equal_one_process_on_a_hugging_face_pair(tokenizer, tmp_path):
    """`--shard` under torchrun (2 gloo processes) learns the transforms one process learns (max |Δ| ≤ 1e-4)."""
    from safetensors.torch import load_file
    from test_dual_distributed import _torchrun

    dirs = _pair(tmp_path, "llama", tokenizer)
    common = ["--method", "dual", "--dataset", "austen", "--steps", "3", "--limit-train", "32", "--batch-size", "4"]
    run_cli("align", *dirs, *common, "--out", tmp_path / "one")
    res = _torchrun("-m", "modeconn", "align", *dirs, *common, "--shard", "--out", tmp_path / "two", cwd=tmp_path,
                    outputs=tmp_path / "two")
    assert "on 2 processes" in res.stdout
    one, two = (load_file(tmp_path / d / "transforms.safetensors") for d in ("one", "two"))
    assert set(one) == set(two) and one
    delta = max(float((one[k] - two[k]).abs().max()) for k in one)
    assert delta <= 1e-4, delta
    assert json.loads((tmp_path / "two" / "alignment.json").read_text())["world_size"] == 2


@pytest.mark.parametrize("family", list(FAMILIES))
def test_merge_align_dual_writes_a_scored_merge_and_weights_one_zero_compute_a(family, tokenizer, tmp_path):
    """`merge --align dual`: the two dual-matched endpoints merged in the absorbed space, scored and written as the
    family can hold it (stock / absorbed); with weights 1,0 the merge is the transformed A, which computes A — a merge
    of untransformed weights or of the wrong side would not."""
    dirs = _pair(tmp_path, family, tokenizer)
    common = ["--align", "dual", "--dataset", "austen", "-o", "steps=2", "--limit-train", "32"]
    res = run_cli("merge", *dirs, *common, "--out", tmp_path / "m")
    record = json.loads((tmp_path / "m" / "merge.json").read_text())
    assert record["align"] == "dual" and record["format"] == FORMAT[family] and record["test"]["perplexity"] > 1
    assert "perplexity" in res.output
    run_cli("eval", tmp_path / "m", "--dataset", "austen", "--limit-train", "32", "--out", tmp_path / "e")
    scored = json.loads((tmp_path / "e" / "results.json").read_text())["test"]
    assert scored["loss"] == pytest.approx(record["test"]["loss"], rel=1e-4)  # the written merge is the scored one
    run_cli("merge", *dirs, *common, "--weights", "1,0", "--out", tmp_path / "a")
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = T.AutoModelForCausalLM.from_pretrained(dirs[0]).eval()(input_ids=ids).logits
        got = _load(tmp_path / "a", FORMAT[family])(input_ids=ids).logits
    assert (got - ref).abs().max() <= 1e-3 * max(1.0, float(ref.abs().max()))


def test_merge_align_dual_refuses_three_models_and_dtype(tokenizer, tmp_path):
    dirs = _pair(tmp_path, "llama", tokenizer)
    res = run_cli("merge", *dirs, dirs[0], "--align", "dual", "--dataset", "austen", "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "merges two models" in res.output, res.output
    res = run_cli("merge", *dirs, "--align", "dual", "--dataset", "austen", "--dtype", "bfloat16",
                  "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "--dtype" in res.output, res.output
    assert not (tmp_path / "o").exists()
