"""Reach, round 2 (#34): the model types users hold beyond the first family tables.

The tested transformers range (the installed release — what a fresh install gets — lies inside what pyproject.toml
states); CLIP's vision tower on transformers 5's module tree; multimodal wrappers (Llava, Gemma-3: the language
model's spaces with the projector writing its stream) or, without an adapter, refused with a reason that names the
language model inside; streaming equal to in memory for the new encoders, vision towers and wrappers (the new
decoders: test_hf_families.py's DECODERS). Spec validity, random elements, planted recovery, negative controls and
the richer groups run with every family of ``hf_tiny.TINY`` in test_hf_adapters.py; absorption and the full group
(or its refusal) in test_hf_families.py.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import torch
import transformers as T
from cli_runner import run_cli
from hf_tiny import make, max_diff, outputs

import modeconn as mc
from modeconn.errors import UnsupportedOperationError
from modeconn.io.hf import side_files
from modeconn.stream import hf_checkpoint_spec, stream_apply, stream_weight_matching
from modeconn.symmetry import hf

pytestmark = pytest.mark.usefixtures("one_thread")
T.logging.set_verbosity_error()

REPO = Path(__file__).resolve().parents[1]
_TEXT = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
         "num_hidden_layers": 2, "vocab_size": 50, "max_position_embeddings": 32, "pad_token_id": 0}
_VISION = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64, "num_hidden_layers": 2,
           "image_size": 8, "patch_size": 4}


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def test_the_installed_transformers_is_inside_the_stated_range():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("transformers"))
    lower = re.search(r">=([\d.]+)", spec).group(1)
    upper = re.search(r"<([\d.]+)", spec).group(1)
    assert _version(lower) <= _version(T.__version__) < _version(upper), (spec, T.__version__)


@pytest.mark.parametrize("name", ["clip_vision", "clip_vision_proj"])
def test_clip_vision_tower_on_the_installed_module_tree(name):
    model = make(name)
    spec = hf.hf_symmetry_spec(model)
    assert spec.structure.family == "clip_vision_model"
    assert "residual" not in spec.spaces  # the stream is the model's output: frozen by default
    spec = hf.hf_symmetry_spec(model, permute_outputs=True)
    assert "residual" in spec.spaces


WRAPPERS = {  # Llava, Gemma-3 and Mistral-3 have adapters (hf_tiny: "llava", "gemma3_cg", "mistral3")
    "paligemma": lambda: T.PaliGemmaForConditionalGeneration(T.PaliGemmaConfig(
        vision_config={**_VISION, "model_type": "siglip_vision_model"},
        text_config={"model_type": "gemma", "head_dim": 8, **_TEXT}, image_token_index=1)),
}


@pytest.mark.parametrize("name", list(WRAPPERS))
def test_multimodal_wrappers_without_an_adapter_are_refused_naming_the_language_model(name, tmp_path):
    torch.manual_seed(0)
    model = WRAPPERS[name]()
    why = r"composite model holding .*language model 'model.language_model'"
    with pytest.raises(UnsupportedOperationError, match=why):
        hf.hf_symmetry_spec(model)
    model.save_pretrained(tmp_path / "a")
    with pytest.raises(UnsupportedOperationError, match=why):
        hf_checkpoint_spec(tmp_path / "a")
    res = run_cli("align", tmp_path / "a", tmp_path / "a", "--out", tmp_path / "o", ok=False)
    assert res.exit_code == 2 and "composite model" in res.output and "object has no attribute" not in res.output
    inner = model.model.language_model  # the language model alone is supported (registered or inferred)
    spec = hf.hf_symmetry_spec(inner, permute_outputs=True)
    assert "residual" in spec.spaces


# ------------------------------------------------------------------ streaming equals in memory (encoders, vision)
@pytest.mark.slow
@pytest.mark.parametrize("name", ["xlm_roberta", "xlm_roberta_mlm", "clip_vision_proj", "dinov2_cls", "beit_relative_bias",
                                  "siglip_cls", "modernbert", "llava", "gemma3_cg", "mistral3",
                                  "siglip_vision_head", "albert_mlm", "albert_cls_groups",
                                  "deberta_v3_mlm", "deberta_v2_pos_proj", "mobilebert_mlm", "mobilebert_cls", "mamba", "convnext", "swin"])
def test_streaming_equals_in_memory_and_outputs_load(name, tmp_path):
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
    back = type(mb).from_pretrained(aligned).eval()
    x = hf.example_inputs(mb)
    assert max_diff(outputs(back, x), outputs(mb, x)) < 1e-4


# ------------------------------------------------------------------ negative controls: what the new tables state
def _changes(model, spec, g=None) -> float:
    from hf_tiny import loaded

    x = hf.example_inputs(model)
    g = spec.random_element(seed=0) if g is None else g
    return max_diff(outputs(model, x), outputs(loaded(model, spec.apply(model.state_dict(), g)), x))


def _with_table(model, **changes):
    import dataclasses

    from modeconn.symmetry.hf import prenorm

    return prenorm.describe(dataclasses.replace(prenorm.TABLES[hf.adapter_for(model).family], **changes), model, "")


def _with_attentions(model, **changes):
    import dataclasses

    st = hf.describe(model)
    return dataclasses.replace(st, attentions=tuple(dataclasses.replace(a, **changes) for a in st.attentions))


@pytest.mark.parametrize(("name", "groups", "wrong"), [
    ("codegen", "permutation", {"qkv_layout": "per_head"}),  # CodeGen's [Q|V|K] chunks read as another layout
    ("gpt_bigcode_mha", "permutation", {"qkv_layout": "blocks"}),  # multi_query=False: per-head fused rows
    ("glm", {"qk": "head_invertible"}, {"rotary": "half"}),  # GLM rotates interleaved pairs
])
def test_the_stated_layout_matters(name, groups, wrong):
    model = make(name)
    assert _changes(model, hf.hf_symmetry_spec(model, groups)) < 1e-4
    assert _changes(model, hf.build_spec(_with_table(model, **wrong), model.state_dict(), groups)) > 1e-3


@pytest.mark.parametrize(("name", "groups", "unfrozen"), [
    ("beit_relative_bias", {"heads": "permutation", "qk": None, "vo": None}, {"frozen_roles": ()}),  # per-head bias

    ("mpt_alibi", {"heads": "permutation", "qk": "head_orthogonal", "vo": "head_orthogonal"}, {"frozen_roles": ()}),
    ("hunyuan_dense", {"qk": "head_orthogonal"}, {"frozen_roles": ()}),  # one head_dim Q/K norm shared by all heads
    ("persimmon", {"qk": "head_orthogonal"}, {"frozen_roles": ()}),
])
def test_frozen_roles_are_frozen_for_a_reason(name, groups, unfrozen):
    model = make(name)
    spec = hf.hf_symmetry_spec(model, groups)
    assert _changes(model, spec) < 1e-4
    assert _changes(model, hf.build_spec(_with_attentions(model, **unfrozen), model.state_dict(), groups)) > 1e-3


def test_nemotron_layernorm_scales_by_one_plus_weight():
    from modeconn.errors import AbsorptionError

    model = make("nemotron")
    mc.absorb_normalization(model)
    wrong = _with_table(model, norm_offset=0.0)
    adapter = hf.Adapter("nemotron", lambda m, p: wrong, hf.ADAPTERS.get("nemotron").example, ("NemotronForCausalLM",))
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(hf.ADAPTERS._items, "nemotron", adapter)
        with pytest.raises(AbsorptionError, match="fold"):
            mc.absorb_normalization(model)


def test_apertus_activation_parameters_are_frozen():
    model = make("apertus")
    spec = hf.hf_symmetry_spec(model, {"ffn_scale": None})
    act = [k for k in model.state_dict() if ".act_fn." in k]
    assert act and all(k in spec.structure.frozen and spec.tensors[k] == () for k in act)


@pytest.mark.parametrize(("name", "tensors"), [
    ("dinov2_cls", ".layer_scale1.lambda1"),  # layer scales move with the stream
    ("beit", ".lambda_2"),
    ("dinov2_cls", "classifier.weight"),  # the classifier reads two copies of the stream: both bound
    ("llava", "multi_modal_projector.linear_2.weight"),  # the projector writes the language model's stream
    ("gemma3_cg", "mm_input_projection_weight"),
    ("mistral3", "multi_modal_projector.linear_2.weight"),
    ("albert_mlm", "embeddings.LayerNorm.weight"),  # ALBERT's embedding space: its LayerNorm …
    ("albert_mlm", "predictions.dense.weight"),  # … and the MLM transform, whose decoder is tied to the word table
    ("deberta_v3_mlm", "encoder.rel_embeddings.weight"),  # DeBERTa's position table is read through Q/K columns …
    ("deberta_v3_mlm", "encoder.LayerNorm.weight"),  # … after its LayerNorm
    ("minicpm3", "q_a_layernorm.weight"),  # latent attention: the norms on the query and KV latents
    ("deepseek_v3", "kv_a_layernorm.weight"),
    ("swin", "layers.0.downsample.norm.weight"),  # Swin's patch merging norm: four blocks of stage 0's channels
    ("convnext", "layers.0.dwconv.weight"),  # ConvNeXt: depthwise convolutions move with their stage's channels …
    ("convnext", "downsampling_layer.0.weight"),  # … the downsampling LayerNorm with the stage it normalises …
    ("convnext", "layer_scale_parameter"),  # … and the layer scales
    ("mobilebert_mlm", "cls.predictions.dense.weight"),  # MobileBERT: the MLM transform's channels beyond the word table
    ("mobilebert_mlm", "bottleneck.attention.LayerNorm.weight"),  # the shared query/key input's NoNorm
])
def test_layer_scales_copied_heads_and_projectors_must_move_with_the_stream(name, tensors):
    import dataclasses

    model = make(name)
    spec = hf.hf_symmetry_spec(model)
    assert _changes(model, spec) < 1e-4
    keep_first = tensors == "classifier.weight"  # drop the second copy's binding only
    wrong = dataclasses.replace(spec, tensors={k: (v[:1] if keep_first else ()) if k.endswith(tensors) else v
                                               for k, v in spec.tensors.items()})
    assert any(k.endswith(tensors) for k in spec.tensors)
    assert _changes(model, wrong) > 1e-3


def test_albert_embedding_space_and_shared_layers():
    """One head/FFN space per stored layer (4 applications of 2 groups × 2 layers: 4 stored), the embedding space
    (size 16) read by embedding_hidden_mapping_in's columns: without that binding the logits change."""
    import dataclasses

    model = make("albert_cls_groups")
    spec = hf.hf_symmetry_spec(model)
    assert sum(s.endswith(".ffn") for s in spec.spaces) == 4
    emb = "albert.embeddings"
    assert spec.spaces[emb].size == 16
    assert _changes(model, spec) < 1e-4
    key = "albert.encoder.embedding_hidden_mapping_in.weight"
    wrong = dataclasses.replace(spec, tensors={**spec.tensors, key: tuple(b for b in spec.tensors[key] if b.space != emb)})
    assert _changes(model, wrong) > 1e-3


@pytest.mark.parametrize("groups", ["permutation", {"heads": "permutation", "qk": "head_invertible", "vo": None}])
def test_deberta_position_projections_move_with_the_heads(groups):
    """``share_att_key=False``: pos_query_proj / pos_key_proj rows follow each head's Q / K rows (their columns read
    the stream); bound to the stream only, the logits change."""
    import dataclasses

    model = make("deberta_v2_pos_proj")
    spec = hf.hf_symmetry_spec(model, groups)
    assert _changes(model, spec) < 1e-4
    pos = {k for k in spec.tensors if ".pos_key_proj." in k or ".pos_query_proj." in k}
    assert len(pos) == 8
    wrong = dataclasses.replace(spec, tensors={k: tuple(b for b in v if k not in pos or b.space == "residual")
                                               for k, v in spec.tensors.items()})
    assert _changes(model, wrong) > 1e-3


def test_deberta_convolution_is_refused_naming_the_field():
    from modeconn.errors import SpecError

    model = T.DebertaV2Model(T.DebertaV2Config(**_TEXT, conv_kernel_size=3, relative_attention=True))
    with pytest.raises(SpecError, match="conv_kernel_size"):
        hf.hf_symmetry_spec(model)


@pytest.mark.parametrize("name", ["minicpm3", "deepseek_v2_no_q_latent"])
def test_latent_attention_rotary_query_rows_move_with_their_head(name):
    """A head's rotary Q rows (scored against the one rotary key every head shares) move with the head; left behind,
    head permutations change the logits. Per-head Q/K maps act on the non-rotary dims only."""
    import dataclasses

    groups = {"heads": "permutation", "qk": "head_invertible", "vo": "head_invertible"}
    model = make(name)
    spec = hf.hf_symmetry_spec(model, groups)
    assert dict(spec.spaces[next(s for s in spec.spaces if s.endswith(".qk"))].params)["dim"] == 8  # nope dims
    assert _changes(model, spec) < 1e-4
    st = hf.describe(model)
    no_extra = tuple(dataclasses.replace(a, heads=tuple(dataclasses.replace(h, extra=()) for h in a.heads))
                     for a in st.attentions)
    wrong = hf.build_spec(dataclasses.replace(st, attentions=no_extra), model.state_dict(), groups)
    assert _changes(model, wrong) > 1e-3


def test_deepseek_mixture_of_experts_layers_are_refused_naming_the_field():
    from modeconn.errors import SpecError

    model = T.DeepseekV3ForCausalLM(T.DeepseekV3Config(
        **_TEXT | {"num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                   "qk_rope_head_dim": 4, "v_head_dim": 8, "first_k_dense_replace": 1, "n_routed_experts": 4,
                   "num_experts_per_tok": 2, "moe_intermediate_size": 16}))
    with pytest.raises(SpecError, match="first_k_dense_replace.*Mixture-of-Experts"):
        hf.hf_symmetry_spec(model)


def test_mobilebert_trigram_blocks_and_value_read_their_spaces():
    """embedding_transformation reads the word table's space three times (the trigram); the value projection reads
    the stream, not the bottleneck: each binding dropped changes the logits."""
    import dataclasses

    model = make("mobilebert_mlm")
    spec = hf.hf_symmetry_spec(model)
    assert _changes(model, spec) < 1e-4
    emb = "mobilebert.embeddings.word_embeddings"
    et, value = "mobilebert.embeddings.embedding_transformation.weight", "mobilebert.encoder.layer.0.attention.self.value.weight"
    assert sum(b.space == emb for b in spec.tensors[et]) == 3
    for key, space in ((et, emb), (value, "residual")):
        kept = [b for b in spec.tensors[key] if b.space != space]
        if key == et:
            kept += [b for b in spec.tensors[key] if b.space == space][:1]  # the first trigram block only
        wrong = dataclasses.replace(spec, tensors={**spec.tensors, key: tuple(kept)})
        assert _changes(model, wrong) > 1e-3, key


@pytest.mark.parametrize(("field", "value"), [("use_bottleneck_attention", True), ("key_query_shared_bottleneck", False)])
def test_mobilebert_other_bottleneck_wirings_are_refused_naming_the_field(field, value):
    from modeconn.errors import SpecError

    model = T.MobileBertModel(T.MobileBertConfig(**_TEXT | {"embedding_size": 16, "intra_bottleneck_size": 16,
                                                           "true_hidden_size": 16, field: value}))
    with pytest.raises(SpecError, match=field):
        hf.hf_symmetry_spec(model)


def test_albert_checkpoint_with_shared_layers_reads_as_deep_as_its_config(tmp_path):
    """albert-base's shape: 12 applications of one stored layer (fewer tensors than 12 layers would store)."""
    from hf_tiny import randomize

    torch.manual_seed(0)
    model = randomize(T.AlbertForMaskedLM(T.AlbertConfig(**_TEXT | {"embedding_size": 16, "num_hidden_layers": 12})))
    model.save_pretrained(tmp_path / "a")
    spec = hf_checkpoint_spec(tmp_path / "a")
    assert set(spec.spaces) == set(hf.hf_symmetry_spec(model).spaces)


def test_swin_bias_columns_follow_heads_and_merging_reads_four_blocks():
    """Each head's relative position bias column moves with the head; patch merging's reduction reads stage 0's
    channels in all four concatenated blocks: either left behind changes the logits."""
    import dataclasses

    groups = {"heads": "permutation", "qk": None, "vo": None}
    model = make("swin")
    spec = hf.hf_symmetry_spec(model, groups)
    assert _changes(model, spec) < 1e-4
    st = hf.describe(model)
    no_bias = tuple(dataclasses.replace(a, heads=tuple(dataclasses.replace(h, extra=()) for h in a.heads))
                    for a in st.attentions)
    tables = tuple(k for k in model.state_dict() if k.endswith("relative_position_bias_table"))
    frozen = dataclasses.replace(st, attentions=no_bias, frozen=(*st.frozen, *tables))  # the tables stay put
    assert _changes(model, hf.build_spec(frozen, model.state_dict(), groups)) > 1e-3
    spec = hf.hf_symmetry_spec(model)
    red, stage = "swin.encoder.layers.0.downsample.reduction.weight", "swin.encoder.layers.0"
    assert sum(b.space == stage for b in spec.tensors[red]) == 4
    first = [b for b in spec.tensors[red] if b.space != stage] + [b for b in spec.tensors[red] if b.space == stage][:1]
    assert _changes(model, dataclasses.replace(spec, tensors={**spec.tensors, red: tuple(first)})) > 1e-3


def test_siglip_pooling_head_follows_the_stream():
    """The probe moves with the stream and in_proj's columns read it: with the stream permuted (permute_outputs),
    last_hidden_state comes back permuted and pooler_output unchanged; without the probe's binding it changes."""
    import dataclasses

    from hf_tiny import loaded

    model = make("siglip_vision_head")
    x = hf.example_inputs(model)
    spec = hf.hf_symmetry_spec(model, permute_outputs=True)
    g = spec.random_element(seed=0)

    def moved(s):
        with torch.no_grad():
            return loaded(model, s.apply(model.state_dict(), g))(**x)

    with torch.no_grad():
        ref = model(**x)
    out = moved(spec)
    assert (ref.last_hidden_state[..., g["residual"]] - out.last_hidden_state).abs().max() < 1e-4
    assert (ref.pooler_output - out.pooler_output).abs().max() < 1e-4
    wrong = dataclasses.replace(spec, tensors={k: (() if k == "head.probe" else v) for k, v in spec.tensors.items()})
    assert (ref.pooler_output - moved(wrong).pooler_output).abs().max() > 1e-3


# ------------------------------------------------------------------ refused with the reason
REFUSED_MODELS = {
    "marian": (lambda: T.MarianMTModel(T.MarianConfig(vocab_size=50, d_model=32, encoder_layers=1, decoder_layers=1,
                                                      encoder_attention_heads=4, decoder_attention_heads=4,
                                                      max_position_embeddings=32, pad_token_id=0)), "sinusoidal"),
    "mamba2": (lambda: T.Mamba2ForCausalLM(T.Mamba2Config(vocab_size=50, hidden_size=32, state_size=4, num_heads=4,
                                                          head_dim=16, n_groups=1, num_hidden_layers=2)), "Mamba-2"),
    "convnextv2": (lambda: T.ConvNextV2ForImageClassification(T.ConvNextV2Config(
        hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=5)), "global response normalisation"),
}


@pytest.mark.parametrize("name", list(REFUSED_MODELS))
def test_model_types_without_a_layout_are_refused_with_the_reason(name):
    from modeconn.symmetry.hf.refused import REFUSED

    build, why = REFUSED_MODELS[name]
    torch.manual_seed(0)
    model = build()
    assert model.config.model_type in REFUSED
    with pytest.raises(UnsupportedOperationError, match=rf"{name!r} .*is not supported: .*{why}"):
        hf.hf_symmetry_spec(model)


def test_no_refused_model_type_has_an_adapter():
    from modeconn.symmetry.hf.refused import REFUSED

    assert not set(REFUSED) & set(hf.supported_model_types())


def test_modernbert_first_layer_reads_the_stream_without_a_norm():
    """Layer 0's ``attn_norm`` is an ``nn.Identity``: its Q/K/V read the (embedding-normed) stream directly, bound."""
    model = make("modernbert")
    st = hf.describe(model)
    assert not any(n.path.endswith("layers.0.attn_norm") for n in st.stream.norms)
    from hf_tiny import loaded

    spec = hf.hf_symmetry_spec(model, permute_outputs=True)
    assert any(b.space == "residual" for b in spec.tensors["layers.0.attn.Wqkv.weight"])
    g = spec.random_element(seed=0)
    x = hf.example_inputs(model)
    ref, got = outputs(model, x), outputs(loaded(model, spec.apply(model.state_dict(), g)), x)
    perm = g["residual"]  # the stream is the output: it comes back permuted, and nothing else changes
    assert (ref["last_hidden_state"][..., perm] - got["last_hidden_state"]).abs().max() < 1e-4
