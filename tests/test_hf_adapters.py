"""Hugging Face adapters: specs for GPT-NeoX, GPT-2, Llama, BERT, ViT (tiny random configs + the real MiniLM)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers as T
from hf_tiny import NAMES, digest, loaded, make, max_diff, outputs
from torch import nn

import modeconn as mc
from modeconn.errors import ConfigError, SpecError, UnsupportedOperationError
from modeconn.symmetry import hf
from modeconn.symmetry.spec import AxisBinding, Space

pytestmark = pytest.mark.usefixtures("one_thread")
# the residual stream is the model output: frozen by default
BASE_MODELS = {"bert", "vit_base", "clip_vision", "clip_vision_proj", "dinov2", "siglip_vision", "modernbert", "siglip_vision_head",
               "t5_base", "t5_encoder", "bart_base", "albert_base", "mobilebert_base", "convnext_base", "swin_base_abs_pos"}


def _spec(name):
    model = make(name)
    return model, mc.symmetry_spec(model), hf.example_inputs(model)


@pytest.mark.parametrize("name", NAMES)
def test_spec_validates_and_covers_every_tensor(name):
    model, spec, _ = _spec(name)
    assert isinstance(spec, hf.HFSymmetrySpec)
    spec.validate(model)
    sd = model.state_dict()
    assert set(spec.tensors) == set(sd)
    assert ("residual" in spec.spaces) == (name not in BASE_MODELS)
    for alias in spec.aliases:  # tied tensors: bound once, on the primary
        assert spec.tensors[alias] == ()
    assert all(spec.probes[s] for s in spec.spaces)  # activation matching can observe every space


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_element_preserves_outputs(name, seed):
    model, spec, x = _spec(name)
    sd = model.state_dict()
    before = digest(model)
    g = spec.random_element(seed=seed)
    sd_g = spec.apply(sd, g)
    assert digest(model) == before, "apply mutated the model"
    assert any(not torch.equal(sd[k], sd_g[k]) for k in sd)
    ref, got = outputs(model, x), outputs(loaded(model, sd_g), x)
    assert max_diff(ref, got) < 1e-4
    back = spec.apply(sd_g, spec.inverse(g))
    assert all(torch.equal(back[k], sd[k]) for k in sd)


@pytest.mark.parametrize("name", NAMES)
def test_fused_permutation_gather_equals_sequential_application(name):
    model, spec, _ = _spec(name)
    g = spec.random_element(seed=4)
    for k, t in model.state_dict().items():
        binds = spec.tensors[k]
        assert torch.equal(spec.apply_tensor(k, t, g), mc.SymmetrySpec.apply_tensor(spec, k, t, g))
        if len(binds) > 2:
            fused = spec.apply_tensor(k, t, g, skip=binds[1])
            assert torch.equal(fused, mc.SymmetrySpec.apply_tensor(spec, k, t, g, skip=binds[1]))


def _roll(n):
    return torch.roll(torch.arange(n), 1)


def _without(spec, drop):
    """The spec with the bindings for which ``drop(key, binding)`` is true removed."""
    tensors = {k: tuple(b for b in bs if not drop(k, b)) for k, bs in spec.tensors.items()}
    return dataclasses.replace(spec, tensors=tensors)


@pytest.mark.parametrize("name", NAMES)
def test_negative_control_dropped_ffn_binding_changes_outputs(name):
    model, spec, x = _spec(name)
    ffn = next(s for s in spec.spaces if s.endswith(".ffn"))
    broken = _without(spec, lambda k, b: b.space == ffn and b.side == "in")
    g = spec.identity() | {ffn: _roll(spec.spaces[ffn].size)}
    assert max_diff(outputs(model, x), outputs(loaded(model, broken.apply(model.state_dict(), g)), x)) > 1e-3


@pytest.mark.parametrize("name", ["gpt_neox", "gpt2", "bert", "vit"])
def test_negative_control_q_without_k_changes_outputs(name):
    model, spec, x = _spec(name)
    att = spec.structure.attentions[0]
    k = att.kv_heads[0].k
    qk = f"{att.path}.qk0"
    k_at = {(s.key, s.offset + att.rotary_dims) for s in k}
    broken = _without(spec, lambda key, b: b.space == qk and (key, b.offset) in k_at)
    g = spec.identity() | {qk: _roll(spec.spaces[qk].size)}
    assert max_diff(outputs(model, x), outputs(loaded(model, broken.apply(model.state_dict(), g)), x)) > 1e-3
    ok = spec.apply(model.state_dict(), g)
    assert max_diff(outputs(model, x), outputs(loaded(model, ok), x)) < 1e-4


@pytest.mark.parametrize("name", ["gpt_neox", "llama"])
def test_rotary_dims_cannot_be_permuted_even_in_pairs(name):
    """Moving whole RoPE pairs (i, i + r/2) jointly in q and k changes the function: pairs rotate at different
    frequencies. This is why the adapters leave rotary dims out of the qk permutation spaces."""
    model, spec, x = _spec(name)
    att = spec.structure.attentions[0]
    r = att.rotary_dims
    assert r >= 4
    kv = att.kv_heads[0]
    slices = [s for h in kv.queries for s in att.heads[h].q] + list(kv.k)
    binds = {}
    for s in slices:
        binds.setdefault(s.key, []).extend(
            [AxisBinding(s.axis, "pairs", "out", 1, s.offset, True), AxisBinding(s.axis, "pairs", "out", 1, s.offset + r // 2, True)]
        )
    sd = model.state_dict()
    pairs = mc.SymmetrySpec({"pairs": Space("pairs", r // 2)}, {k: tuple(binds.get(k, ())) for k in sd})
    sd_p = pairs.apply(sd, {"pairs": _roll(r // 2)})
    assert max_diff(outputs(model, x), outputs(loaded(model, sd_p), x)) > 1e-3


def test_gqa_value_transform_must_reach_every_query_head_of_its_group():
    model, spec, x = _spec("llama")
    att = spec.structure.attentions[0]
    kv = att.kv_heads[0]
    assert len(kv.queries) == 2
    vo = f"{att.path}.vo0"
    second_o = att.heads[kv.queries[1]].o[0]
    broken = _without(spec, lambda key, b: b.space == vo and key == second_o.key and b.offset == second_o.offset)
    g = spec.identity() | {vo: _roll(spec.spaces[vo].size)}
    assert max_diff(outputs(model, x), outputs(loaded(model, broken.apply(model.state_dict(), g)), x)) > 1e-3
    assert not any(s.startswith(att.path + ".qk") for s in spec.spaces)  # Llama: every q/k dim is rotary


def test_tied_embeddings_stay_tied(tmp_path):
    model, spec, x = _spec("gpt2")
    assert dict(spec.aliases) == {"lm_head.weight": "transformer.wte.weight"}
    sd = model.state_dict()
    g = spec.random_element(seed=3)
    sd_g = spec.apply(sd, g)
    assert sd_g["lm_head.weight"] is sd_g["transformer.wte.weight"]
    m_g = loaded(model, sd_g)
    assert m_g.lm_head.weight.data_ptr() == m_g.transformer.wte.weight.data_ptr()
    assert max_diff(outputs(model, x), outputs(m_g, x)) < 1e-4
    m_g.save_pretrained(tmp_path)
    back = T.GPT2LMHeadModel.from_pretrained(tmp_path, local_files_only=True)
    assert back.lm_head.weight.data_ptr() == back.transformer.wte.weight.data_ptr()
    assert max_diff(outputs(model, x), outputs(back, x)) < 1e-4
    # a state dict without the tied key (as stored on disk) is accepted; a stale alias is refused
    sd_g2 = spec.apply({k: v for k, v in sd.items() if k != "lm_head.weight"}, g)
    assert "lm_head.weight" not in sd_g2 and torch.equal(sd_g2["transformer.wte.weight"], sd_g["transformer.wte.weight"])
    stale = dict(sd) | {"lm_head.weight": sd["lm_head.weight"] + 1}
    with pytest.raises(SpecError, match="tied"):
        spec.apply(stale, g)


@pytest.mark.parametrize("name", NAMES)
def test_weight_matching_recovers_a_planted_element(name):
    model, spec, _ = _spec(name)
    sd = model.state_dict()
    g = spec.random_element(seed=7)
    sd_b = spec.apply(sd, g)
    res = mc.weight_matching(spec, sd, sd_b, restarts=2)
    assert spec.equal(res.element, spec.inverse(g))
    aligned = spec.apply(sd_b, res.element)
    assert all(torch.equal(aligned[k], sd[k]) for k in sd)


def test_activation_matching_recovers_a_planted_element():
    model, spec, _ = _spec("gpt_neox")
    g = spec.random_element(seed=5)
    model_b = loaded(model, spec.apply(model.state_dict(), g))
    gen = torch.Generator().manual_seed(0)
    loader = [torch.randint(0, 50, (4, 16), generator=gen) for _ in range(3)]
    res = mc.activation_matching(spec, model, model_b, loader)
    assert spec.equal(res.element, spec.inverse(g))
    full = hf.hf_symmetry_spec(model, groups={"heads": "permutation", "qk": "head_orthogonal", "vo": "head_orthogonal"})
    with pytest.raises(ConfigError, match="activation matching solves permutations only"):
        mc.activation_matching(full, model, model_b, loader)


class _Wrap(nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, **kw):
        return self.lm(**kw)


def test_wrapper_of_one_hf_model():
    inner = make("gpt_neox")
    model = _Wrap(inner)
    spec = mc.symmetry_spec(model)
    assert all(k.startswith("lm.") for k in spec.tensors) and set(spec.tensors) == set(model.state_dict())
    assert all(p.module.startswith("lm.") for ps in spec.probes.values() for p in ps)
    x = hf.example_inputs(model)
    sd_g = spec.apply(model.state_dict(), spec.random_element(seed=0))
    assert max_diff(outputs(model, x), outputs(loaded(model, sd_g), x)) < 1e-4
    two = nn.ModuleDict({"a": make("gpt2"), "b": make("gpt2")})
    with pytest.raises(SpecError, match="2 Hugging Face models"):
        mc.symmetry_spec(two)
    model.extra = nn.Linear(3, 3)
    with pytest.raises(SpecError, match="extra.weight"):
        mc.symmetry_spec(model)


def test_unsupported_model_type_lists_supported():
    # OPT, then MPT (this test's models until the table-driven families, then #34) are supported now; FNet's layout
    # fits no table (the supported list grew: the names are no longer adjacent)
    cfg = T.FNetConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1, max_position_embeddings=32)
    with pytest.raises(UnsupportedOperationError, match="'fnet'.*gpt2, .*gpt_neox, gptj, .*llama") as e:
        mc.symmetry_spec(T.FNetModel(cfg))
    assert "bert" in str(e.value) and "vit" in str(e.value)


def test_unsupported_config_option_names_the_field():
    cfg = T.GPT2Config(n_embd=32, n_head=4, n_layer=1, vocab_size=50, n_positions=32, add_cross_attention=True)
    with pytest.raises(SpecError, match="add_cross_attention"):
        mc.symmetry_spec(T.GPT2LMHeadModel(cfg))


def test_unknown_head_names_the_tensors():
    model = make("gpt2")
    model.extra_head = nn.Linear(32, 2)
    with pytest.raises(SpecError, match=r"extra_head\.weight.*supported model classes: GPT2Model"):
        mc.symmetry_spec(model)


def test_check_same_config_names_differing_fields():
    a, b = make("gpt_neox"), make("gpt_neox", seed=1)
    hf.check_same_config(a, b)
    c = T.GPTNeoXForCausalLM(T.GPTNeoXConfig(rotary_pct=0.5, vocab_size=50, max_position_embeddings=32,
                                             num_hidden_layers=3, hidden_size=32, num_attention_heads=4,
                                             intermediate_size=64, bos_token_id=0, eos_token_id=0, pad_token_id=0))
    with pytest.raises(ConfigError, match="num_hidden_layers: 2 vs 3"):
        hf.check_same_config(a, c)
    with pytest.raises(ConfigError, match="GPTNeoXForCausalLM vs GPT2LMHeadModel"):
        hf.check_same_config(a, make("gpt2"))


def test_permute_outputs_permutes_the_last_hidden_state():
    model = make("bert")
    spec = hf.hf_symmetry_spec(model, permute_outputs=True)
    x = hf.example_inputs(model)
    g = spec.random_element(seed=2)
    ref, got = outputs(model, x), outputs(loaded(model, spec.apply(model.state_dict(), g)), x)
    torch.testing.assert_close(got["last_hidden_state"], ref["last_hidden_state"][..., g["residual"]], atol=1e-4, rtol=0)
    torch.testing.assert_close(got["pooler_output"], ref["pooler_output"], atol=1e-4, rtol=0)


def test_groups_option_and_errors():
    model = make("gpt_neox")
    spec = hf.hf_symmetry_spec(model, groups={"qk": None})
    assert not any(".qk" in s for s in spec.spaces) and any(".vo" in s for s in spec.spaces)
    with pytest.raises(ConfigError, match="unknown symmetry roles"):
        hf.hf_symmetry_spec(model, groups={"bogus": "permutation"})
    with pytest.raises(ConfigError, match="supported for 'ffn'"):
        hf.hf_symmetry_spec(model, groups={"ffn": "orthogonal"})
    with pytest.raises(ConfigError, match="example_input"):
        mc.symmetry_spec(nn.Linear(2, 2))


RICHER = {
    "wreath": {"heads": "permutation", "qk": "head_invertible", "vo": "head_invertible"},
    "per_head_orthogonal": {"qk": "head_orthogonal", "vo": "head_orthogonal"},
}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("groups", list(RICHER))
def test_richer_groups_preserve_outputs(name, groups):
    """Head permutations with per-head invertible QK/OV maps (RoPE-commuting on rotary pairs), per-head rotations."""
    model = make(name)
    spec = hf.hf_symmetry_spec(model, groups=RICHER[groups])
    spec.validate(model)
    x = hf.example_inputs(model)
    sd = model.state_dict()
    g = spec.random_element(seed=3)
    sd_g = spec.apply(sd, g)
    assert max_diff(outputs(model, x), outputs(loaded(model, sd_g), x)) < 1e-4
    back = spec.apply(sd_g, spec.inverse(g))
    assert all(torch.allclose(back[k], sd[k], atol=1e-5) for k in sd)


def test_head_transforms_need_the_rotary_restriction():
    """Negative control: the same per-head invertible maps without the RoPE pair structure break the model."""
    model = make("gpt_neox")
    x = hf.example_inputs(model)
    st = hf.describe(model)
    no_rope = dataclasses.replace(st, attentions=tuple(dataclasses.replace(a, rotary_dims=0) for a in st.attentions))
    spec = hf.build_spec(no_rope, model.state_dict(), {"qk": "head_invertible"})
    g = spec.random_element(seed=0)
    assert max_diff(outputs(model, x), outputs(loaded(model, spec.apply(model.state_dict(), g)), x)) > 1e-3


def test_ffn_scaling_on_glu_and_relu_only():
    for model in (make("llama"), T.GPTNeoXForCausalLM(T.GPTNeoXConfig(
            hidden_act="relu", rotary_pct=0.5, vocab_size=50, max_position_embeddings=32, num_hidden_layers=2,
            hidden_size=32, num_attention_heads=4, intermediate_size=64)).eval()):
        spec = hf.hf_symmetry_spec(model, groups={"ffn_scale": "scaling"})
        assert spec.spaces[next(s for s in spec.spaces if s.endswith("ffn_scale"))].parent.endswith(".ffn")
        x = hf.example_inputs(model)
        sd_g = spec.apply(model.state_dict(), spec.random_element(seed=1))
        assert max_diff(outputs(model, x), outputs(loaded(model, sd_g), x)) < 1e-4
    with pytest.raises(SpecError, match="gelu"):
        hf.hf_symmetry_spec(make("gpt_neox"), groups={"ffn_scale": "scaling"})
    with pytest.raises(ConfigError, match="per-head group"):
        hf.hf_symmetry_spec(make("gpt2"), groups={"heads": "permutation"})


def test_minilm_planted(shared_data):
    """The real all-MiniLM-L6-v2 (BertModel): a random permutation keeps the outputs, weight matching finds it."""
    path = shared_data / "minilm"
    model = T.BertModel.from_pretrained(path, local_files_only=True).eval()
    spec = mc.symmetry_spec(model)
    spec.validate(model)
    assert len(spec.spaces) == 6 * (12 + 12 + 1)
    x = {"input_ids": torch.tensor([[101, 7592, 2088, 2003, 1037, 3231, 102], [101, 2204, 2851, 102, 0, 0, 0]]),
         "attention_mask": torch.tensor([[1] * 7, [1, 1, 1, 1, 0, 0, 0]])}
    g = spec.random_element(seed=11)
    sd = model.state_dict()
    sd_g = spec.apply(sd, g)
    assert max_diff(outputs(model, x), outputs(loaded(model, sd_g), x)) < 1e-4
    res = mc.weight_matching(spec, sd, sd_g, restarts=1)
    assert spec.equal(res.element, spec.inverse(g))
