"""Trust round 3, class 4 (Hugging Face half) — the automatic fallback for unknown model types could be fooled.

The fallback verified a layout on a 2-layer instance and 8 tokens, so a model whose layer 3 on, or whose positions
from 16 on, act differently passed; it cached its verdict by class *name*; and it verified one random permutation,
then granted head permutations, per-head Q/K and V/O maps and FFN scaling unverified. Now the verification instance
has every layer (or, for a config too large to build, at least every distinct layer kind and every layer up to a
stated period or threshold), runs the example and a sequence near the position limit, checks an element that moves
every unit, and grants a richer group only where a random element of it keeps the function. Each test has a broken
variant (the old behaviour, monkeypatched) that accepts the fooling model.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaMLP
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

from modeconn.errors import SpecError, UnsupportedOperationError
from modeconn.symmetry import hf
from modeconn.symmetry.hf import infer

T.logging.set_verbosity_error()


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    monkeypatch.setattr(infer, "_CACHE", {})


def _gain(h: torch.Tensor, where: torch.Tensor | bool) -> torch.Tensor:
    g = torch.ones(h.shape[-1])
    g[0] = 3.0  # one channel of the residual stream: no permutation moving it commutes with this
    return torch.where(torch.as_tensor(where), h * g, h)


class DeepGain(LlamaDecoderLayer):
    """Channel 0 tripled from the third layer on."""

    def forward(self, hidden_states, *args, **kwargs):
        return _gain(super().forward(hidden_states, *args, **kwargs), self.self_attn.layer_idx >= 2)


class LateGain(LlamaDecoderLayer):
    """Channel 0 tripled at positions 16 and later."""

    def forward(self, hidden_states, *args, **kwargs):
        h = super().forward(hidden_states, *args, **kwargs)
        return _gain(h, torch.arange(h.shape[1])[None, :, None] >= 16)


def _with_layers(layer_cls):
    class Unknown(T.LlamaForCausalLM):  # one class name for every variant: the fallback's cache must tell them apart
        def __init__(self, config):
            super().__init__(config)
            self.model.layers = nn.ModuleList(layer_cls(config, i) for i in range(config.num_hidden_layers))

    return Unknown


def _config(layers: int = 4, **kw) -> T.LlamaConfig:
    cfg = T.LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                        num_hidden_layers=layers, vocab_size=50, max_position_embeddings=64, pad_token_id=0, **kw)
    cfg.model_type = "unknown_llama"
    return cfg


def _model(layer_cls, cfg=None):
    torch.manual_seed(0)
    return _with_layers(layer_cls)(cfg or _config())


def _old_verification(config):  # the broken variant: 2 layers, the example's 8 tokens
    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = min(cfg.num_hidden_layers, 2)
    return cfg, 8


def test_a_model_whose_later_layers_or_positions_differ_is_refused(monkeypatch):
    assert "llama" in hf.adapter_for(_model(LlamaDecoderLayer)).family  # the plain layout is inferred
    for layer_cls in (DeepGain, LateGain):
        with pytest.raises(UnsupportedOperationError, match=r"llama: its names fit, but a random permutation changed "
                                                            r"the outputs .* on 8 and 62 tokens"):
            hf.adapter_for(_model(layer_cls))
    monkeypatch.setattr(infer, "verification_config", _old_verification)
    for layer_cls in (DeepGain, LateGain):  # broken: both pass as Llama
        assert "llama" in hf.adapter_for(_model(layer_cls)).family


class FullAttentionGain(Qwen2DecoderLayer):
    """Channel 0 tripled in the full-attention layers only (the fifth of eight)."""

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.full = config.layer_types[layer_idx] == "full_attention"

    def forward(self, hidden_states, *args, **kwargs):
        return _gain(super().forward(hidden_states, *args, **kwargs), self.full)


def _qwen2_full_attention_gain():
    class Unknown(T.Qwen2ForCausalLM):
        def __init__(self, config):
            super().__init__(config)
            self.model.layers = nn.ModuleList(FullAttentionGain(config, i) for i in range(config.num_hidden_layers))

    cfg = T.Qwen2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                        num_hidden_layers=8, vocab_size=50, max_position_embeddings=64, use_sliding_window=True,
                        sliding_window=4096, layer_types=["sliding_attention"] * 4 + ["full_attention"]
                        + ["sliding_attention"] * 3)
    cfg.model_type = "unknown_qwen2"
    torch.manual_seed(0)
    return Unknown(cfg)


def test_every_layer_kind_the_config_describes_is_verified_even_when_the_model_is_cut(monkeypatch):
    model = _qwen2_full_attention_gain()
    cfg, length = infer.verification_config(model.config)
    assert cfg.num_hidden_layers == 8 and cfg.layer_types == model.config.layer_types and length == 62
    assert cfg.sliding_window == 31  # below the long length, so that windowed layers differ from full ones
    monkeypatch.setattr(infer, "VERIFY_PARAMETERS", 1)  # as if the model were too large to build whole
    cfg, _ = infer.verification_config(model.config)
    assert cfg.num_hidden_layers == 5 and cfg.layer_types[-1] == "full_attention"
    with pytest.raises(UnsupportedOperationError, match="qwen2: its names fit, but a random permutation changed"):
        hf.adapter_for(model)
    monkeypatch.setattr(infer, "layers_needed", lambda cfg: 2)  # broken: the first two layers only
    assert "inferred" in hf.adapter_for(_qwen2_full_attention_gain()).family


def test_a_config_too_large_to_build_is_narrowed_and_still_verified(monkeypatch):
    monkeypatch.setattr(infer, "VERIFY_PARAMETERS", 1)
    cfg = T.GraniteConfig(hidden_size=64, num_attention_heads=8, num_key_value_heads=4, intermediate_size=256,
                          num_hidden_layers=3, vocab_size=2000, max_position_embeddings=64, pad_token_id=1999,
                          embedding_multiplier=3.0, residual_multiplier=0.5, logits_scaling=2.0)
    small, length = infer.verification_config(cfg)
    assert (small.num_attention_heads, small.num_key_value_heads, small.hidden_size) == (4, 2, 32)  # head_dim 8 kept
    assert small.intermediate_size == 64 and small.vocab_size == 1024 and small.pad_token_id == 1999 % 1024
    assert small.num_hidden_layers == 2 and length == 62
    torch.manual_seed(0)
    model = T.GraniteForCausalLM(cfg)
    assert "inferred for granite" in hf.adapter_for(model).family


def test_the_position_limit_is_shrunk_only_where_the_encoding_does_not_read_it():
    def verified(**kw):
        cfg = T.LlamaConfig(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
                            vocab_size=50, **kw)
        return infer.verification_config(cfg)

    cfg, length = verified(max_position_embeddings=4096)  # plain RoPE: the limit is only a table size
    assert cfg.max_position_embeddings == infer.LONG_CAP and length == infer.LONG_CAP - 2
    cfg, length = verified(max_position_embeddings=4096, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert cfg.max_position_embeddings == 4096 and length == infer.LONG_CAP  # dynamic NTK reads it: kept
    cfg, length = verified(max_position_embeddings=32)
    assert cfg.max_position_embeddings == 32 and length == 30


def test_layers_needed_reads_per_layer_lists_index_lists_and_periods():
    cfg = T.Qwen2Config(num_hidden_layers=12, layer_types=["sliding_attention"] * 6 + ["full_attention"] * 6)
    assert infer.layers_needed(cfg) == 7
    cfg = T.Qwen2MoeConfig(num_hidden_layers=12, mlp_only_layers=[0, 1, 2], decoder_sparse_step=1)
    assert infer.layers_needed(cfg) >= 4  # a listed layer and an unlisted one
    cfg = T.Gemma3TextConfig(num_hidden_layers=30, sliding_window_pattern=6)
    assert infer.layers_needed(cfg) >= 6


class BothBranchesActivated(LlamaMLP):
    """``down(act(gate) · act(up))``: permutations of the FFN units hold, scaling the up branch does not."""

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.act_fn(self.up_proj(x)))


class SquashedQueries(nn.Linear):
    """Q through tanh: head permutations and V/O maps hold, per-head Q/K matrices do not."""

    def forward(self, x):
        return torch.tanh(super().forward(x))


def _unverified_groups_model():
    class Unknown(T.LlamaForCausalLM):
        def __init__(self, config):
            super().__init__(config)
            for layer in self.model.layers:
                layer.mlp = BothBranchesActivated(config)
                q = layer.self_attn.q_proj
                layer.self_attn.q_proj = SquashedQueries(q.in_features, q.out_features, bias=False)

    torch.manual_seed(0)
    return Unknown(_config(2))


def test_richer_groups_are_granted_only_where_they_keep_the_function(monkeypatch):
    model = _unverified_groups_model()
    adapter = hf.adapter_for(model)
    assert adapter.groups["qk"] == ("permutation",) and "ffn_scale" not in adapter.groups
    assert adapter.groups["heads"] == ("permutation",) and "head_orthogonal" in adapter.groups["vo"]
    hf.hf_symmetry_spec(model, {"heads": "permutation", "qk": None, "vo": "head_invertible"})  # verified: fine
    for groups, named in (({"ffn_scale": "scaling"}, "ffn_scale=scaling"), ({"qk": "head_orthogonal"},
                                                                           "qk=head_orthogonal")):
        with pytest.raises(SpecError, match=rf"\['{named}'\] were not shown to keep this model's function"):
            hf.hf_symmetry_spec(model, groups)

    monkeypatch.setattr(infer, "_CACHE", {})
    monkeypatch.setattr(infer._Check, "granted", lambda self, describe: dict(hf.SUPPORTED))  # broken: all granted
    spec = hf.hf_symmetry_spec(model, {"ffn_scale": "scaling"})
    moved = copy.deepcopy(model)
    moved.load_state_dict(spec.apply(model.state_dict(), spec.random_element(seed=0)))
    x = torch.randint(0, 50, (1, 8))
    with torch.no_grad():  # the silently wrong spec it returns
        assert (model(x).logits - moved(x).logits).abs().max() > 1e-3
