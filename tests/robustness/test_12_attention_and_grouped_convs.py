"""Class 12: attention handled as an opaque block, the value projection or positional embeddings left
unpermuted (output changes), grouped/depthwise convolutions silently skipped.

Traced attention (CCT: separate q/k/v/o projections) and the Hugging Face adapters (fused GPT-NeoX QKV) bind
every attention tensor — value rows with the output projection's columns, per head — and the positional
embedding; a random element keeps the logits. Negative controls: applying the same element but leaving the
value projection, or the positional embedding, or the whole attention block ("opaque") untouched changes the
logits — exactly the bug class. A grouped (non-depthwise) convolution gets group-preserving permutations (#18;
it was refused before), never skipped: its tensors are bound and the function is kept, while a permutation that
moves channels across groups changes the logits (negative control); a depthwise convolution is supported.
"""

from __future__ import annotations

import torch
from archs import make as make_arch
from hf_tiny import loaded, make, max_diff, outputs
from rb_helpers import logits
from torch import nn

import modeconn as mc
from modeconn.symmetry.hf import example_inputs


def _partial_apply(spec, sd, g, skip):
    """``spec.apply(sd, g)`` except the tensors for which ``skip(key)`` is true (left as they were)."""
    out = spec.apply(sd, g)
    return {k: (sd[k] if skip(k) else v) for k, v in out.items()}


def test_traced_attention_binds_value_projection_and_positional_embedding():
    model, x = make_arch("cct")
    spec = mc.symmetry_spec(model, x)
    sd = model.state_dict()
    for key in ("pos_embedding", "blocks.0.attn.v_proj.weight", "blocks.0.attn.o_proj.weight"):
        assert spec.tensors[key], f"{key} is not bound"
    g = spec.random_element(seed=0)
    ref = logits(model, sd, x)
    assert torch.allclose(logits(model, spec.apply(sd, g), x), ref, atol=1e-5)
    for name, skip in [("value projection", lambda k: ".v_proj." in k),
                       ("positional embedding", lambda k: k == "pos_embedding"),
                       ("opaque attention", lambda k: ".attn." in k)]:
        broken = logits(model, _partial_apply(spec, sd, g, skip), x)
        assert (broken - ref).abs().max() > 1e-3, f"leaving the {name} unpermuted went unnoticed"


def test_hf_attention_binds_fused_qkv_value_rows_and_dense_columns():
    model = make("gpt_neox")
    spec = mc.symmetry_spec(model)
    x = example_inputs(model)
    sd = model.state_dict()
    qkv = "gpt_neox.layers.0.attention.query_key_value.weight"
    assert {b.side for b in spec.tensors[qkv]} == {"out", "in"}
    g = spec.random_element(seed=1)
    ref = outputs(model, x)
    assert max_diff(ref, outputs(loaded(model, spec.apply(sd, g)), x)) < 1e-4
    opaque = _partial_apply(spec, sd, g, lambda k: ".attention." in k)
    assert max_diff(ref, outputs(loaded(model, opaque), x)) > 1e-3


class _Grouped(nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.mix = nn.Conv2d(8, 8, 3, padding=1, groups=groups)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        return self.head(torch.relu(self.mix(torch.relu(self.stem(x)))).mean((2, 3)))


def test_grouped_convolutions_are_group_preserving_never_skipped():
    x = torch.randn(4, 3, 6, 6)
    model = _Grouped(2).eval()
    spec = mc.symmetry_spec(model, x)
    sd = model.state_dict()
    assert spec.tensors["mix.weight"] and spec.tensors["mix.bias"]  # bound, not skipped
    g = spec.random_element(seed=0)
    assert torch.allclose(logits(model, spec.apply(sd, g), x), logits(model, sd, x), atol=1e-5)
    cross = torch.tensor([0, 4, 2, 3, 1, 5, 6, 7])  # swaps a channel of group 0 with one of group 1
    moved = dict(sd) | {"mix.weight": sd["mix.weight"][cross], "mix.bias": sd["mix.bias"][cross],
                        "head.weight": sd["head.weight"][:, cross]}
    assert (logits(model, moved, x) - logits(model, sd, x)).abs().max() > 1e-3
    depthwise = _Grouped(8).eval()
    spec = mc.symmetry_spec(depthwise, x)
    g = spec.random_element(seed=0)
    assert any(not torch.equal(g[s], torch.arange(len(g[s]))) for s in spec.spaces)  # something moves
    sd = depthwise.state_dict()
    assert torch.allclose(logits(depthwise, spec.apply(sd, g), x), logits(depthwise, sd, x), atol=1e-5)
