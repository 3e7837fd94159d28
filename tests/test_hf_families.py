"""The table-driven Hugging Face families: absorption and the full group, what is frozen and why (negative
controls), streaming equal to in memory, outputs that transformers loads and generates from, the CLI on sharded
fp16/bf16 Mistral and Qwen2 pairs. (Per-family spec validity, random elements, planted recovery and the richer
groups run over every family of ``hf_tiny.TINY`` in test_hf_adapters.py.)"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers as T
from cli_runner import run_cli
from hf_tiny import loaded, make, max_diff, outputs

import modeconn as mc
from modeconn.errors import AbsorptionError, UnsupportedOperationError
from modeconn.io.hf import side_files
from modeconn.stream import hf_checkpoint_spec, stream_apply, stream_merge, stream_weight_matching
from modeconn.symmetry import hf
from modeconn.symmetry.hf import prenorm
from modeconn.path.interpolate import weighted_average

pytestmark = pytest.mark.usefixtures("one_thread")

PRE_NORM = ["mistral", "qwen2", "qwen3", "gemma", "phi3", "phi", "olmo", "stablelm", "starcoder2", "gptj", "opt",
            "falcon", "deit", "cohere", "cohere_qk_norm", "stablelm_parallel_qk_ln", "phi_qk_ln", "falcon_grouped",
            "falcon_alibi_mha", "llama_biases_tied", "deit_plain",
            # reach, round 2 (#34)
            "arcee", "nemotron", "vaultgemma", "hunyuan_dense", "glm", "apertus", "persimmon", "gpt_neo", "codegen",
            "gpt_bigcode", "gpt_bigcode_mha", "mpt", "mpt_alibi", "siglip_cls",
            "minicpm3", "deepseek_v2_no_q_latent", "deepseek_v3"]
NOT_ABSORBABLE = {"gemma2": "sandwich", "gemma3": "sandwich", "olmo2": "post-norms", "bloom": "word_embeddings_layernorm",
                  "clip": "pre_layrnorm", "clip_vision": "pre_layrnorm",
                  "roberta": "post-LN", "electra": "post-LN", "distilbert": "post-LN", "glm4": "post-norms",
                  "xlm_roberta": "post-LN", "dinov2_cls": "layer scales", "beit": "layer scales",
                  "modernbert": "embeddings.norm", "llava": "multimodal wrapper", "gemma3_cg": "multimodal wrapper",
                  "mistral3": "multimodal wrapper", "mamba": "reads its RMSNorm's weight",
                  "convnext": "inside each branch", "swin": "patch merging"}
DECODERS = ["gpt_neox", "gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "phi", "olmo", "olmo2",
            "stablelm", "starcoder2", "gptj", "opt", "falcon", "bloom", "gemma3", "cohere", "falcon_grouped",
            "falcon_alibi_mha", "llama_biases_tied", "stablelm_parallel_qk_ln",
            "arcee", "nemotron", "vaultgemma", "hunyuan_dense", "glm", "glm4", "apertus", "persimmon", "gpt_neo", "codegen",
            "gpt_bigcode", "gpt_bigcode_mha", "mpt", "mpt_alibi", "minicpm3", "deepseek_v2_no_q_latent", "deepseek_v3",
            # Mixture-of-Experts (stored per expert by transformers 5, streamed as banks)
            "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe", "qwen2_moe_dense_layer"]
FULL = {"residual": "orthogonal", "heads": "permutation", "qk": "head_invertible", "vo": "head_invertible"}


def _changes(model, spec, g, x) -> float:
    return max_diff(outputs(model, x), outputs(loaded(model, spec.apply(model.state_dict(), g)), x))


# ----------------------------------------------------------------------------------------- absorption
@pytest.mark.parametrize("name", PRE_NORM)
def test_absorption_then_the_full_group_keeps_outputs(name):
    model = make(name)
    x = hf.example_inputs(model)
    absorbed = mc.absorb_normalization(model)
    assert max_diff(outputs(model, x), outputs(absorbed, x)) < 1e-4
    assert {n.kind for n in hf.describe(absorbed).stream.norms} == {"rms"}
    groups = FULL | ({"ffn_scale": "scaling"} if hf.describe(model).ffns[0].gate else {})
    spec = hf.hf_symmetry_spec(absorbed, groups=groups)
    assert spec.spaces["residual"].group == "orthogonal"
    g = spec.random_element(seed=2)
    assert max_diff(outputs(model, x), outputs(loaded(absorbed, spec.apply(absorbed.state_dict(), g)), x)) < 1e-4
    # negative control: the same orthogonal residual map on the model before absorption breaks it
    raw = hf.hf_symmetry_spec(model)
    n = raw.spaces["residual"].size
    q = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(0)))[0]
    rotated = dict(model.state_dict())
    for key, b in raw.bindings_by_space["residual"]:
        t = rotated[key].movedim(b.axis, 0)
        rotated[key] = (q @ t.reshape(q.shape[0], -1)).reshape(t.shape).movedim(0, b.axis)
    assert max_diff(outputs(model, x), outputs(loaded(model, rotated), x)) > 1e-3


@pytest.mark.parametrize("name", list(NOT_ABSORBABLE))
def test_absorption_refused_with_the_reason(name):
    with pytest.raises(UnsupportedOperationError, match=NOT_ABSORBABLE[name]):
        mc.absorb_normalization(make(name))


def test_gemma_scale_is_one_plus_weight(monkeypatch):
    """Negative control: folding Gemma's RMSNorm as if it scaled by ``w`` (not ``1 + w``) is caught by the
    absorption's own output check."""
    model = make("gemma")
    mc.absorb_normalization(model)  # with the table's offset: fine
    wrong = dataclasses.replace(prenorm.TABLES["gemma"], norm_offset=0.0)
    adapter = hf.Adapter("gemma", lambda m, p: prenorm.describe(wrong, m, p), wrong.example, wrong.classes)
    monkeypatch.setitem(hf.ADAPTERS._items, "gemma", adapter)
    with pytest.raises(AbsorptionError, match="fold"):
        mc.absorb_normalization(model)


# ----------------------------------------------------------------------------- what is frozen, and why
def _unfrozen(model, groups, **replace):
    """The spec built with every attention's frozen / permutation-only roles replaced (a deliberately wrong spec)."""
    st = hf.describe(model)
    atts = tuple(dataclasses.replace(a, **replace) for a in st.attentions)
    return hf.build_spec(dataclasses.replace(st, attentions=atts), model.state_dict(), groups)


def test_alibi_freezes_head_permutations():
    model = make("bloom")
    x = hf.example_inputs(model)
    groups = {"heads": "permutation", "qk": "head_orthogonal", "vo": "head_orthogonal"}
    spec = hf.hf_symmetry_spec(model, groups=groups)
    assert not any(s.endswith(".heads") for s in spec.spaces) and any(s.endswith(".vo") for s in spec.spaces)
    assert _changes(model, spec, spec.random_element(seed=1), x) < 1e-4
    wrong = _unfrozen(model, groups, frozen_roles=())
    heads = next(s for s in wrong.spaces if s.endswith(".heads"))
    assert _changes(model, wrong, wrong.identity() | {heads: torch.roll(torch.arange(4), 1)}, x) > 1e-3


def test_shared_per_head_qk_norm_freezes_the_qk_role():
    model = make("qwen3")
    x = hf.example_inputs(model)
    spec = hf.hf_symmetry_spec(model, groups={"qk": "head_orthogonal"})
    assert not any(".qk" in s for s in spec.spaces)
    assert "model.layers.0.self_attn.q_norm.weight" in spec.structure.frozen
    wrong = _unfrozen(model, {"qk": "head_orthogonal"}, frozen_roles=())
    assert _changes(model, wrong, wrong.random_element(seed=0), x) > 1e-3


def test_clip_qkv_allows_permutations_only():
    model = T.OlmoForCausalLM(T.OlmoConfig(num_key_value_heads=2, clip_qkv=0.5, hidden_size=32, num_attention_heads=4,
                                           intermediate_size=64, num_hidden_layers=2, vocab_size=50,
                                           max_position_embeddings=32, pad_token_id=0))
    from hf_tiny import randomize

    model = randomize(model, 0)
    x = hf.example_inputs(model)
    spec = hf.hf_symmetry_spec(model, groups={"vo": "head_orthogonal"})
    assert not any(s.endswith(".vo") for s in spec.spaces)
    perm = hf.hf_symmetry_spec(model)
    assert any(".vo" in s for s in perm.spaces) and _changes(model, perm, perm.random_element(seed=0), x) < 1e-4
    wrong = _unfrozen(model, {"vo": "head_orthogonal"}, permutation_only=())
    assert _changes(model, wrong, wrong.random_element(seed=0), x) > 1e-3


def test_whole_projection_qk_norm_moves_with_the_heads():
    model = make("olmo2")
    x = hf.example_inputs(model)
    groups = {"heads": "permutation", "qk": None, "vo": None}
    spec = hf.hf_symmetry_spec(model, groups=groups)
    heads = next(s for s in spec.spaces if s.endswith(".heads"))
    g = spec.identity() | {heads: torch.tensor([1, 0])}
    assert _changes(model, spec, g, x) < 1e-4
    norm = "model.layers.0.self_attn.q_norm.weight"
    assert any(b.space == heads for b in spec.tensors[norm])
    wrong = dataclasses.replace(spec, tensors={k: (() if k == norm else v) for k, v in spec.tensors.items()})
    assert _changes(model, wrong, g, x) > 1e-3


def test_the_fused_qkv_layout_matters():
    """GPT-NeoX's ``per_head`` rows read as ``blocks``: a spec that validates but breaks the function."""
    model = make("gpt_neox")
    x = hf.example_inputs(model)
    t = dataclasses.replace(prenorm.TABLES["gpt_neox"], qkv_layout="blocks")
    wrong = hf.build_spec(prenorm.describe(t, model, ""), model.state_dict())
    wrong.validate(model)
    assert _changes(model, wrong, wrong.random_element(seed=0), x) > 1e-3


def test_interleaved_rotary_pairs_matter():
    """GPT-J rotates (2i, 2i+1): per-head maps built for rotate_half pairs break it."""
    model = make("gptj")
    x = hf.example_inputs(model)
    ok = hf.hf_symmetry_spec(model, groups={"qk": "head_invertible"})
    assert _changes(model, ok, ok.random_element(seed=0), x) < 1e-4
    wrong = _unfrozen(model, {"qk": "head_invertible"}, rotary_style="half")
    assert _changes(model, wrong, wrong.random_element(seed=0), x) > 1e-3


# ----------------------------------------------------------------------------- streaming, transformers
def _ids(model, seed=0):
    return torch.randint(0, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids):
    with torch.no_grad():
        return model.float().eval()(input_ids=ids).logits


@pytest.mark.slow
@pytest.mark.parametrize("name", DECODERS)
def test_streaming_equals_in_memory_and_outputs_load_and_generate(name, tmp_path):
    ma, mb = make(name, 0), make(name, 1)
    da, db = tmp_path / "a", tmp_path / "b"
    for m, d in ((ma, da), (mb, db)):
        m.save_pretrained(d, max_shard_size="20KB")
    spec_m, spec_c = hf.hf_symmetry_spec(ma), hf_checkpoint_spec(da)
    ref = mc.weight_matching(spec_m, ma.state_dict(), mb.state_dict(), restarts=1, max_iter=5)
    res = stream_weight_matching(spec_c, da, db, restarts=1, max_iter=5)
    assert all(torch.equal(res.element[s], ref.element[s]) for s in ref.element)
    aligned = tmp_path / "aligned"
    stream_apply(spec_c, db, res.element, aligned, files=side_files(db))
    back = T.AutoModelForCausalLM.from_pretrained(aligned).eval()
    ids = _ids(ma)
    torch.testing.assert_close(_logits(back, ids), _logits(mb, ids), rtol=1e-4, atol=1e-4)
    assert back.generate(ids, max_new_tokens=3, do_sample=False).shape == (2, 9)
    merged = tmp_path / "merged"
    stream_merge(spec_c, [da, db], merged, elements=[None, res.element], files=side_files(da))
    expected = weighted_average([ma.state_dict(), spec_m.apply(mb.state_dict(), res.element)])
    got = T.AutoModelForCausalLM.from_pretrained(merged).eval()
    sd = got.state_dict()
    assert set(sd) == set(expected) and all(torch.equal(sd[k], expected[k]) for k in expected)
    assert got.generate(ids, max_new_tokens=2, do_sample=False).shape == (2, 8)


def _lm_pair(tmp_path, cls, cfg, dtype):
    dirs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        from hf_tiny import randomize

        m = randomize(cls(cfg), seed).to(dtype)
        d = tmp_path / f"{cls.__name__}-{seed}"
        m.save_pretrained(d, max_shard_size="20KB")
        dirs.append(d)
    assert len(list(dirs[0].glob("*.safetensors"))) > 1  # sharded
    return dirs


@pytest.mark.slow
@pytest.mark.parametrize("family", ["mistral", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cli_align_and_merge_sharded_half_precision_pairs(family, dtype, tmp_path):
    cls, cfg_cls = {"mistral": (T.MistralForCausalLM, T.MistralConfig), "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config)}[family]
    cfg = cfg_cls(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                  num_hidden_layers=2, vocab_size=50, max_position_embeddings=32, pad_token_id=0, bos_token_id=0,
                  eos_token_id=0)
    da, db = _lm_pair(tmp_path, cls, cfg, dtype)
    out = tmp_path / "aligned"
    run_cli("align", da, db, "--out", out, "--restarts", "1", "--max-iter", "5")
    b = T.AutoModelForCausalLM.from_pretrained(db).eval()
    aligned = T.AutoModelForCausalLM.from_pretrained(out).eval()
    assert next(aligned.parameters()).dtype == dtype
    ids = _ids(b)
    torch.testing.assert_close(_logits(aligned, ids), _logits(b, ids), rtol=1e-3, atol=1e-3)
    assert aligned.generate(ids, max_new_tokens=3, do_sample=False).shape == (2, 9)
    merged = tmp_path / "merged"
    run_cli("merge", da, db, "--out", merged, "--align", "weight", "--restarts", "1", "--max-iter", "5")
    m = T.AutoModelForCausalLM.from_pretrained(merged).eval()
    assert torch.isfinite(_logits(m, ids)).all()
    assert m.generate(ids, max_new_tokens=3, do_sample=False).shape == (2, 9)


# ----------------------------------------------------------------------------- automatic fallback
def _granite(layers=3):
    from hf_tiny import randomize

    torch.manual_seed(0)
    cfg = T.GraniteConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                          num_hidden_layers=layers, vocab_size=50, max_position_embeddings=32, pad_token_id=0,
                          embedding_multiplier=3.0, residual_multiplier=0.5, logits_scaling=2.0)
    return randomize(T.GraniteForCausalLM(cfg), 0)


def test_unknown_model_type_with_a_known_layout_is_inferred_and_checked(tmp_path):
    """Granite has no adapter; it is Llama's layout with scalar multipliers: inferred, then verified."""
    model = _granite()
    assert "granite" not in hf.supported_model_types()
    spec = mc.symmetry_spec(model)
    assert spec.structure.family == "llama" and "inferred" in hf.adapter_for(model).family
    x = hf.example_inputs(model)
    g = spec.random_element(seed=5)
    assert _changes(model, spec, g, x) < 1e-4
    res = mc.weight_matching(spec, model.state_dict(), spec.apply(model.state_dict(), g), restarts=1)
    assert spec.equal(res.element, spec.inverse(g))
    model.save_pretrained(tmp_path / "a", max_shard_size="20KB")  # the config-only (meta) path infers it too
    assert set(hf_checkpoint_spec(tmp_path / "a").spaces) == set(spec.spaces)
    with pytest.raises(UnsupportedOperationError, match="granite has no adapter of its own"):
        mc.absorb_normalization(model)


def test_unknown_model_type_that_fits_no_layout_is_refused_with_reasons():
    model = T.FNetModel(T.FNetConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     max_position_embeddings=32))  # MPT until #34 gave it a table
    with pytest.raises(UnsupportedOperationError, match=r"'fnet'.*no registered layout fits.*\n  llama: .*embed_tokens"):
        mc.symmetry_spec(model)


def test_fallback_refuses_a_layout_whose_names_fit_but_function_breaks(monkeypatch):
    """Negative control of the function check: a GPT-NeoX model under a new model_type, with the only fitting table
    deliberately wrong (fused QKV read as blocks): names and shapes fit, the check refuses it."""
    model = make("gpt_neox")
    monkeypatch.setattr(model.config, "model_type", "my_neox")
    monkeypatch.setitem(prenorm.TABLES, "gpt_neox", dataclasses.replace(prenorm.TABLES["gpt_neox"], qkv_layout="blocks"))
    with pytest.raises(UnsupportedOperationError, match="gpt_neox: its names fit, but a random permutation changed"):
        mc.symmetry_spec(model)
    monkeypatch.undo()
    model.config.model_type = "my_neox2"
    assert mc.symmetry_spec(model).structure.family == "gpt_neox"  # with the right table it is inferred


# ----------------------------------------------------------------------------- config comparison
def test_base_and_instruct_token_ids_do_not_block_alignment(tmp_path):
    """Checkpoints differing only in special-token ids and generation settings are one architecture; a structural
    difference is reported first."""
    a, b = make("qwen2", 0), make("qwen2", 1)
    b.config.eos_token_id, b.config.pad_token_id = 7, 3
    b.generation_config.temperature, b.generation_config.do_sample = 0.3, True
    hf.check_same_config(a, b)
    a.save_pretrained(tmp_path / "base", max_shard_size="20KB")
    b.save_pretrained(tmp_path / "instruct", max_shard_size="20KB")
    run_cli("align", tmp_path / "base", tmp_path / "instruct", "--out", tmp_path / "aligned", "--restarts", "1")
    diffs = hf.config_differences({"eos_token_id": 1, "rope_theta": 1e4, "num_hidden_layers": 2},
                                  {"eos_token_id": 2, "rope_theta": 1e6, "num_hidden_layers": 3})
    assert diffs == ["config.num_hidden_layers: 2 vs 3", "config.rope_theta: 10000.0 vs 1000000.0"]


# ----------------------------------------------------------------------------- barrier on HF causal LMs
@pytest.mark.slow
def test_barrier_on_hugging_face_causal_lms(tmp_path, shared_data):
    """`modeconn barrier A B --dataset austen` on two Hugging Face causal LMs, tokenized with their own
    tokenizer.json; without the tokenizer or a text dataset, the error says what is needed."""
    from modeconn.data import train_tokenizer
    from modeconn.data.text import read_text_file
    from hf_tiny import randomize

    tok = train_tokenizer(read_text_file(shared_data / "austen" / "austen.txt.gz", None)[:200_000], 300)
    cfg = T.Qwen2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                        num_hidden_layers=2, vocab_size=320, max_position_embeddings=64, pad_token_id=0)
    dirs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        d = tmp_path / f"lm{seed}"
        randomize(T.Qwen2ForCausalLM(cfg), seed).save_pretrained(d)
        (d / "tokenizer.json").write_text(tok.to_str())
        dirs.append(d)
    res = run_cli("barrier", *dirs, "--dataset", "austen", "--method", "naive", "--method", "weight", "--lambdas", "3",
                  "--eval-limit", "8", "--limit-train", "16", "--out", tmp_path / "out")
    import json

    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(results["barriers"]) == {"naive", "weight"}
    assert all(torch.isfinite(torch.tensor(v["test"]["barrier_mean_loss"])) for v in results["barriers"].values()), res.output
    bad = run_cli("barrier", *dirs, "--out", tmp_path / "o2", ok=False)
    assert bad.exit_code == 2 and "--dataset austen" in bad.output
    (dirs[0] / "tokenizer.json").unlink()
    bad = run_cli("barrier", *dirs, "--dataset", "austen", "--out", tmp_path / "o3", ok=False)
    assert bad.exit_code == 2 and "tokenizer.json" in bad.output


def test_stream_apply_from_the_api_writes_the_config(tmp_path):
    """#17 item 5: without config.json, from_pretrained would build transformers' default config."""
    m = make("qwen2")
    m.save_pretrained(tmp_path / "b", max_shard_size="20KB")
    spec = hf_checkpoint_spec(tmp_path / "b")
    stream_apply(spec, tmp_path / "b", spec.random_element(seed=0), tmp_path / "out")
    back = T.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(back) is type(m) and back.config.hidden_size == m.config.hidden_size
    ids = _ids(m)
    torch.testing.assert_close(_logits(back, ids), _logits(m, ids), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- streaming absorption (#21 item 1)
ABSORB_STREAMED = ["gpt_neox", "gpt2", "llama_tied_mqa", "mistral", "qwen3", "gemma", "phi3", "phi", "olmo", "stablelm",
                   "starcoder2", "gptj", "opt", "falcon", "cohere", "llama_biases_tied", "deit_plain", "minicpm3", "deepseek_v3",
                   "mixtral", "qwen2_moe"]


@pytest.mark.parametrize("name", ABSORB_STREAMED)
def test_streamed_absorption_equals_in_memory_bit_for_bit(name, tmp_path):
    from modeconn.symmetry.absorb import load_absorbed
    from modeconn.symmetry.absorb_stream import stream_absorb

    model = make(name)
    model.save_pretrained(tmp_path / "src", max_shard_size="20KB")
    before = {p.name: p.read_bytes() for p in (tmp_path / "src").iterdir()}
    stream_absorb(tmp_path / "src", tmp_path / "abs", max_shard_bytes=20_000)
    assert {p.name: p.read_bytes() for p in (tmp_path / "src").iterdir()} == before  # the input is never written
    assert len(list((tmp_path / "abs").glob("*.safetensors"))) > 1  # sharded output, read back by load_absorbed
    back, ref = load_absorbed(tmp_path / "abs").state_dict(), mc.absorb_normalization(model).state_dict()
    assert set(back) == set(ref) and all(torch.equal(back[k], ref[k]) for k in ref)


STOCK_AFTER_ROTATION = {"llama": True, "llama_tied_mqa": True, "mistral": True, "qwen2": True, "qwen3": True,
                        "phi3": True, "llama_biases_tied": True, "gemma": False, "gpt_neox": False, "olmo": False,
                        "phi": False, "stablelm": False, "cohere": False, "gpt2": False}


@pytest.mark.parametrize("name", list(STOCK_AFTER_ROTATION))
def test_the_streamed_stock_decision_agrees_with_stock_model_after_a_rotation(name, tmp_path):
    """stock_norm_weights (the absorption plan, no weights) decides as stock_model (the outputs) on an absorbed model
    moved by a random element of the full group: RMSNorm families hold it; LayerNorm families (a rotation moves the
    stream's mean; olmo, phi and cohere pass on the unrotated model) and Gemma's ``1 + w`` do not."""
    from modeconn.symmetry.absorb_export import stock_model, stock_norm_weights
    from modeconn.symmetry.absorb_stream import AbsorbedView
    from modeconn.symmetry.hf import FULL_GROUPS

    model = make(name)
    model.save_pretrained(tmp_path)
    absorbed = mc.absorb_normalization(model)
    spec = hf.hf_symmetry_spec(absorbed, FULL_GROUPS)
    absorbed.load_state_dict(spec.apply(absorbed.state_dict(), spec.random_element(torch.Generator().manual_seed(1))))
    norms = stock_norm_weights(AbsorbedView(tmp_path))
    assert (norms is not None) == (stock_model(absorbed) is not None) == STOCK_AFTER_ROTATION[name]
    if norms is not None:
        assert set(norms) == {k for k, _ in model.named_parameters() if "norm" in k and k.endswith("weight")} - {
            k for k in absorbed.state_dict() if "norm" in k}  # exactly the stream's norms (qk norms stay)
        assert all(torch.equal(t, torch.ones_like(t)) for t in norms.values())


def test_full_group_streaming_alignment_equals_in_memory_and_keeps_b(tmp_path):
    """`modeconn align A B --groups full` on Hugging Face directories: absorbed tensor by tensor, the full group
    matched streaming (the same element as in memory), a/ and b/ written as absorbed checkpoints; b/ computes B."""
    from modeconn.symmetry.hf import FULL_GROUPS
    from modeconn.symmetry.absorb import load_absorbed

    ma, mb = make("llama", 0), make("llama", 1)
    for m, d in ((ma, "a"), (mb, "b")):
        m.save_pretrained(tmp_path / d, max_shard_size="20KB")
    out = tmp_path / "out"
    res = run_cli("align", tmp_path / "a", tmp_path / "b", "--out", out, "--groups", "full", "--restarts", "1",
                  "--max-iter", "5")
    assert "streaming weight matching objective" in res.output
    aa, ab = mc.absorb_normalization(ma), mc.absorb_normalization(mb)
    ref = mc.weight_matching(hf.hf_symmetry_spec(aa, FULL_GROUPS), aa.state_dict(), ab.state_dict(), restarts=1,
                             max_iter=5)
    import json

    record = json.loads((out / "alignment.json").read_text())
    assert record["groups"] == FULL_GROUPS and "/" not in record["source"]
    assert record["objective"] == pytest.approx(ref.objective, rel=1e-6)
    a_back, b_back = load_absorbed(out / "a"), load_absorbed(out / "b")
    assert all(torch.equal(a_back.state_dict()[k], v) for k, v in aa.state_dict().items())
    ids = _ids(mb)
    torch.testing.assert_close(_logits(b_back, ids), _logits(mb, ids), rtol=1e-4, atol=1e-4)
    spec = hf_checkpoint_spec(out / "b", FULL_GROUPS)  # the absorbed checkpoint's spec, read from its config
    assert spec.spaces["residual"].group == "orthogonal"
    bad = run_cli("align", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "o2", "--groups", "fulll", ok=False)
    assert bad.exit_code == 2 and "--groups" in bad.output
    element = {s: torch.tensor(v) for s, v in record["element"].items()}
    assert all(torch.allclose(element[s].to(ref.element[s].dtype), ref.element[s], atol=1e-6) for s in ref.element)
    bloom = make("bloom")  # absorption does not apply: refused with the reason, before any work
    bloom.save_pretrained(tmp_path / "bloom")
    res = run_cli("align", tmp_path / "bloom", tmp_path / "bloom", "--out", tmp_path / "o3", "--groups", "full", ok=False)
    assert res.exit_code == 2 and "word_embeddings_layernorm" in res.output and not (tmp_path / "o3").exists()
