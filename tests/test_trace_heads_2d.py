"""2-D attention that reshapes a convolution's channels into heads (timm's CoAtNet and MaxViT: a fused q/k/v projection
viewed as ``(B, heads, 3 · head_dim, N)`` and chunked per head; MobileNetV4-hybrid: multi-query attention, one key
and value for all heads): the channel permutations must stay within each head. Each model is traced with the
self-check on, a random element keeps the outputs of a perturbed copy, weight matching recovers a planted element,
and negative controls show that a permutation mixing heads changes the outputs and that broken rules are caught."""

from __future__ import annotations

import pytest
import torch

import modeconn as mc
from spec_checks import assert_kept_and_recovered
from modeconn.errors import SpecError
from modeconn.experiments.zoo import frozen_writers
from modeconn.symmetry.selfcheck import check_function_preserved, perturbed_state
from modeconn.symmetry.trace.ops import attention, indexing

timm = pytest.importorskip("timm")

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = {  # reduced configurations of the real definitions: (kwargs, input size, the fused q/k/v conv)
    "coatnet_0_rw_224": (dict(embed_dim=(16, 32, 64, 64), depths=(1, 1, 1, 1), stem_width=(8, 16),
                              transformer_dim_head=16), 32, "stages.2.blocks.0.attn.qkv"),
    "maxvit_tiny_rw_224": (dict(embed_dim=(16, 32, 32, 32), depths=(1, 1, 1, 1), stem_width=(8, 16),
                                transformer_dim_head=8), 64, "stages.0.blocks.0.attn_block.attn.qkv"),
}


def _build(name: str, **kw) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if name in SMALL:
        kwargs, size = SMALL[name][0], SMALL[name][1]
        model = timm.create_model(name, pretrained=False, num_classes=10, img_size=size, **kwargs, **kw)
    else:
        model, size = timm.create_model(name, pretrained=False, num_classes=10, **kw), 64
    return model.eval(), torch.randn(2, 3, size, size)


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    model.load_state_dict(perturbed_state(model, torch.Generator().manual_seed(3)))
    return model


@pytest.mark.parametrize("name", [*SMALL, "mobilenetv4_hybrid_medium"])
def test_channels_reshaped_into_heads_are_traced_kept_and_recovered(name):
    model, x = _build(name)
    spec = mc.symmetry_spec(model, x)  # the self-check: a random element on a perturbed copy
    assert set(frozen_writers(spec, model)) <= {"head.fc", "classifier"}  # the classifier only
    assert_kept_and_recovered(spec, model, x, _perturbed(model).state_dict())


@pytest.mark.parametrize("name", list(SMALL))
def test_fused_qkv_spaces_stay_within_one_head(name):
    model, x = _build(name)
    qkv = SMALL[name][2]
    heads = model.get_submodule(qkv.rsplit(".", 1)[0]).num_heads
    spec = mc.symmetry_spec(model, x)
    rows = model.get_submodule(qkv).weight.shape[0]
    per_head = rows // heads
    out = [b for b in spec.tensors[f"{qkv}.weight"] if b.side == "out"]
    assert out, "the fused q/k/v rows are permuted"
    for b in out:
        size = spec.spaces[b.space].size
        assert b.offset // per_head == (b.offset + size - 1) // per_head, (b, per_head)
    # q and k of one head share a space, v has its own: per head, two spaces over three parts
    assert len({b.space for b in out}) == 2 * heads


@pytest.mark.parametrize("name", list(SMALL))
def test_a_permutation_mixing_two_heads_changes_the_outputs_one_within_a_head_does_not(name):
    model, x = _build(name)
    qkv = SMALL[name][2]
    heads = model.get_submodule(qkv.rsplit(".", 1)[0]).num_heads
    layer = model.get_submodule(qkv)
    d = layer.weight.shape[0] // heads // 3  # per head: q, k, v of d channels each

    def outputs_after_swapping(i: int, j: int) -> torch.Tensor:  # q channels i ↔ j and the same k channels
        m, _ = _build(name)
        w, b = m.get_submodule(qkv).weight, m.get_submodule(qkv).bias
        rows = [(i, j), (i + d, j + d)]
        with torch.no_grad():
            for p in (w, b):
                for r, s in rows:
                    p[[r, s]] = p[[s, r]]
            return m(x)

    with torch.no_grad():
        ref = model(x)
    torch.testing.assert_close(outputs_after_swapping(0, 1), ref, rtol=1e-4, atol=1e-5)  # within head 0
    assert not torch.allclose(outputs_after_swapping(0, 3 * d), ref, rtol=1e-3, atol=1e-4)  # head 0 ↔ head 1


@pytest.mark.parametrize("name", list(SMALL))
def test_a_chunk_rule_that_hands_the_per_head_parts_out_of_order_is_caught(name, monkeypatch):
    model, x = _build(name)
    real = indexing.head_pieces
    monkeypatch.setattr(indexing, "head_pieces", lambda tr, node, v, sizes: real(tr, node, v, sizes)[::-1])
    with pytest.raises(SpecError, match="changes its function"):
        mc.symmetry_spec(model, x)


@pytest.mark.slow
def test_multi_query_rule_that_leaves_the_heads_queries_unjoined_to_the_key_is_caught(monkeypatch):
    model, x = _build("mobilenetv4_hybrid_medium")
    monkeypatch.setattr(attention, "shared_across_heads",
                        lambda tr, node, vals, nodes, nd: (vals[0].outer is None) != (vals[1].outer is None))
    with pytest.raises(SpecError, match="changes its function"):
        mc.symmetry_spec(model, x)


def _botnet() -> tuple[torch.nn.Module, torch.Tensor]:
    """BoTNet-26t at 64 px with weights of a trained model's scale (timm's initialisation leaves the attention
    logits so small that no permutation of queries and keys could change the outputs)."""
    model, _ = _build("botnet26t_256", img_size=64)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "self_attn" in key:
                p.add_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
    return model, torch.randn(2, 3, 64, 64)


def test_botnet_heads_in_the_batch_axis_share_one_query_key_space_with_the_position_tables():
    model, x = _botnet()
    spec = mc.symmetry_spec(model, x)
    attn = model.get_submodule("stages.2.1.self_attn")
    d, heads = attn.dim_head_qk, attn.num_heads
    rows = {b.offset: b.space for b in spec.tensors["stages.2.1.self_attn.qkv.weight"] if b.side == "out"}
    qk = {rows[o] for o in range(0, 2 * heads * d, d)}
    assert len(qk) == 1  # one table for every head: one within-head permutation for all queries and keys
    assert {b.space for b in spec.tensors["stages.2.1.self_attn.pos_embed.width_rel"]} == qk
    assert len({rows[o] for o in range(2 * heads * d, 3 * heads * d, d)} - qk) == heads  # values: per head
    assert set(frozen_writers(spec, model)) <= {"head.fc"}
    assert check_function_preserved(spec, model, (x,), seed=5) <= 1e-5
    sd = model.state_dict()
    g = spec.random_element(seed=1)
    planted = mc.weight_matching(spec, sd, spec.apply(sd, g), restarts=1, max_iter=5)
    assert spec.equal(planted.element, spec.inverse(g))


@pytest.mark.slow
def test_a_relative_position_rule_that_leaves_the_table_unbound_is_caught(monkeypatch):
    model, x = _botnet()

    def unbound(tr, node, q, table):  # joins the heads but never moves the table with them
        tr.join_heads(node, q)
        return tr.frozen_val(node)

    monkeypatch.setattr(attention, "matmul_parameter", unbound)
    with pytest.raises(SpecError, match="changes its function"):
        mc.symmetry_spec(model, x)


def test_a_relative_position_mlp_bias_gathered_by_token_pair_stays_fixed(monkeypatch):
    torch.manual_seed(0)
    model = timm.create_model("coatnet_rmlp_nano_rw_224", pretrained=False, num_classes=10, img_size=32,
                              **SMALL["coatnet_0_rw_224"][0]).eval()
    x = torch.randn(2, 3, 32, 32)
    spec = mc.symmetry_spec(model, x)
    fc2 = "stages.2.blocks.0.attn.rel_pos.mlp.fc2"
    assert fc2 in frozen_writers(spec, model)  # its output is one bias per head, added to the scores
    assert check_function_preserved(spec, model, (x,), seed=5) <= 1e-5
    monkeypatch.setattr(attention, "fixed_score_terms", lambda tr, node: None)  # the bias left free to move
    with pytest.raises(SpecError, match="changes its function.*rel_pos.mlp.fc2"):
        mc.symmetry_spec(model, x)
