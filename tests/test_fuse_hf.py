"""`modeconn fuse` on Hugging Face causal LMs whose FFN width differs: A planted inside a wider B (B's extra FFN units
have zero outgoing weights; B's residual, heads and FFN units permuted) is recovered exactly by a checkpoint that
``from_pretrained`` loads with A's ``intermediate_size``; the truncation (the broken variant: B's first units) is not.
Widths that cannot change are refused naming the dimension, before any weights are read."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
import transformers as T
from cli_runner import run_cli

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 300
_SIZE = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=VOCAB,
             max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
IDS = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))


def _llama(width: int, seed: int) -> T.LlamaForCausalLM:
    from hf_tiny import randomize

    torch.manual_seed(seed)
    return randomize(T.LlamaForCausalLM(T.LlamaConfig(intermediate_size=width, **_SIZE)), seed)


def _planted(a: T.LlamaForCausalLM, width: int) -> T.LlamaForCausalLM:
    """B of FFN ``width`` computing A's function: A's units first, extra units with zero down-projection columns, then
    a random element of B's group (residual, heads, FFN units) applied."""
    import modeconn as mc

    b = _llama(width, 7)
    m = a.config.intermediate_size
    sd = {k: v.clone() for k, v in b.state_dict().items()}
    for k, v in a.state_dict().items():
        t = sd[k]
        if k.endswith(("gate_proj.weight", "up_proj.weight")):
            t[:m] = v
        elif k.endswith("down_proj.weight"):
            t[:, :m], t[:, m:] = v, 0
        else:
            t.copy_(v)
    spec = mc.symmetry_spec(b, IDS)
    b.load_state_dict(spec.apply(sd, spec.random_element(generator=torch.Generator().manual_seed(3))))
    return b


@pytest.fixture(scope="module")
def pair(tmp_path_factory, shared_data):
    from modeconn.data import train_tokenizer
    from modeconn.data.text import read_text_file

    tokenizer = train_tokenizer(read_text_file(shared_data / "austen" / "austen.txt.gz", None)[:50_000], VOCAB)
    root = tmp_path_factory.mktemp("fuse-hf")
    a = _llama(64, 0)
    b = _planted(a, 96)
    with torch.no_grad():
        assert torch.allclose(a(input_ids=IDS).logits, b(input_ids=IDS).logits, atol=1e-4)  # the plant holds
    for name, model in (("a", a), ("b", b)):
        model.save_pretrained(root / name)
        (root / name / "tokenizer.json").write_text(tokenizer.to_str())
    return root, a


def test_a_planted_in_a_wider_b_is_recovered_by_a_loadable_checkpoint(pair):
    root, a = pair
    run_cli("fuse", root / "a", root / "b", "--dataset", "austen", "--limit-train", "32", "--batches", "2",
            "--out", root / "fused")
    fused = T.AutoModelForCausalLM.from_pretrained(root / "fused").eval()
    assert fused.config.intermediate_size == 64
    with torch.no_grad():
        ref, got = a(input_ids=IDS).logits, fused(input_ids=IDS).logits
    assert (got - ref).abs().max() <= 1e-4 * max(1.0, float(ref.abs().max()))
    record = json.loads((root / "fused" / "fuse.json").read_text())
    assert record["widths"] == [64, 96] and record["intermediate_size"] == 64
    assert min(record["mean_matched_correlation"].values()) > 0.999  # every kept pair is A's unit and its copy


def test_truncation_the_broken_variant_does_not_recover_a(pair):
    from modeconn.checkpoints import open_checkpoints
    from modeconn.data import make_loader
    from modeconn.path.width import merge_widths
    from modeconn.recipes.hf_memory import hf_model, load_wrapped, read_data

    root, a = pair
    ckpts = open_checkpoints([root / "a", root / "b"])
    bundle = read_data(ckpts, "fuse", "austen", None, 32)
    wa, wb = load_wrapped(ckpts, bundle, same_config=False)
    loader = make_loader(bundle.train, 8)
    fused, _ = merge_widths(wa, wb, loader, target=wa, max_batches=2, match=False)
    with torch.no_grad():
        ref, got = a(input_ids=IDS).logits, hf_model(fused)(input_ids=IDS).logits
    assert (got - ref).abs().max() > 1e-2


def _config_dir(root, name, model):
    model.save_pretrained(root / name)
    return root / name


def test_widths_that_cannot_change_are_named_before_any_weights(tmp_path):
    from modeconn.io import save_checkpoint
    from modeconn.models import build_model

    a = _config_dir(tmp_path, "a", _llama(64, 0))
    heads = _config_dir(tmp_path, "h", T.LlamaForCausalLM(T.LlamaConfig(intermediate_size=96, **{
        **_SIZE, "num_attention_heads": 2, "num_key_value_heads": 1})))
    moe = T.MixtralForCausalLM(T.MixtralConfig(intermediate_size=48, num_local_experts=2, **_SIZE))
    cases = {heads: "num_attention_heads \\(the number of attention heads: 4 vs 2\\)",
             _config_dir(tmp_path, "moe", moe): "Mixture-of-Experts.*num_local_experts"}
    qwen = T.Qwen2ForCausalLM(T.Qwen2Config(intermediate_size=96, **_SIZE))
    cases[_config_dir(tmp_path, "qwen", qwen)] = "A is 'llama', B is 'qwen2'"  # the family, not a field it lacks
    save_checkpoint(tmp_path / "mc", build_model("mlp", in_shape=(1, 8, 8), num_classes=10, width=8))
    cases[tmp_path / "mc"] = "one kind"
    for b, message in cases.items():
        for f in b.glob("*.safetensors"):
            f.write_bytes(b"not read")  # refused before any weights are read
        res = run_cli("fuse", a, b, "--dataset", "austen", "--out", tmp_path / "f", ok=False)
        assert res.exit_code == 2 and re.search(message, " ".join(res.output.split())), res.output
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("case,message", [
    ("tied", "config.tie_word_embeddings: False vs True (a tied model's output head is its input embedding"),
    ("head-missing", "stores lm_head.weight, {b} does not")], ids=["tied", "head-missing"])
def test_a_tied_and_an_untied_model_are_refused_naming_both_before_any_data(tmp_path, monkeypatch, case, message):
    """B of another FFN width ties its head (no lm_head.weight stored) or claims an untied head it does not store:
    refused naming tie_word_embeddings or the tensor and both files, before the text or any weights are read (the old
    code fused the second pair with a random head for B)."""
    import modeconn.recipes.hf_memory as hf_memory

    from hf_tiny import drop_stored, resave

    a, b = _config_dir(tmp_path, "a", _llama(64, 0)), _config_dir(tmp_path, "b", _llama(64, 1))
    resave(b, intermediate_size=96, tie_word_embeddings=case == "tied")
    if case == "head-missing":
        drop_stored(b, "lm_head.weight")
    reads = []
    monkeypatch.setattr(hf_memory, "read_data", lambda *args, **kw: reads.append("data"))
    res = run_cli("fuse", a, b, "--dataset", "austen", "--out", tmp_path / "f", ok=False)
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and reads == [], (reads, res.output)
    assert message.format(b=b) in text and str(a) in text and str(b) in text, res.output
    assert not (tmp_path / "f").exists()


def test_a_config_that_leaves_tie_word_embeddings_to_its_default_is_not_refused(tmp_path):
    """B's config.json omits tie_word_embeddings (Llama's default: false), A's states false: one architecture. The
    pair passes every config check and stops only at the missing --dataset."""
    a, b = _config_dir(tmp_path, "a", _llama(64, 0)), _config_dir(tmp_path, "b", _llama(96, 1))
    cfg = json.loads((b / "config.json").read_text())
    assert cfg.pop("tie_word_embeddings") is False
    (b / "config.json").write_text(json.dumps(cfg))
    res = run_cli("fuse", a, b, "--out", tmp_path / "f", ok=False)
    assert res.exit_code == 2 and "pass --dataset" in " ".join(res.output.split()), res.output


def test_an_output_at_an_input_is_refused_as_an_error_line_not_a_traceback(pair):
    root, _ = pair
    for out in (root / "b", root / "b" / "inside"):
        res = run_cli("fuse", root / "a", root / "b", "--dataset", "austen", "--out", out, ok=False)
        assert res.exit_code == 2 and "Traceback" not in res.output and "--out" in res.output, res.output
    assert not (root / "b" / "inside").exists()


def test_the_fused_checkpoint_carries_no_code_of_its_inputs(pair, tmp_path):
    """An input's ``auto_map`` and ``.py`` files are not copied: the fused model was built and checked with
    transformers' own class, and ``trust_remote_code=True`` must not swap in another one (the planted file would
    write a marker when imported)."""
    root, _ = pair
    marker = tmp_path / "imported"
    for name in ("a", "b"):
        shutil.copytree(root / name, tmp_path / name)
        (tmp_path / name / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
        cfg = json.loads((tmp_path / name / "config.json").read_text())
        cfg["auto_map"] = {"AutoModelForCausalLM": "evil.EvilModel"}
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "fused"
    run_cli("fuse", tmp_path / "a", tmp_path / "b", "--dataset", "austen", "--limit-train", "32", "--batches", "1",
            "--out", out)
    assert not (out / "evil.py").exists() and "auto_map" not in json.loads((out / "config.json").read_text())
    assert type(T.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)).__name__ == "LlamaForCausalLM"
    assert not marker.exists()
