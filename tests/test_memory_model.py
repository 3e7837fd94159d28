"""The memory model of sharded dual matching (:mod:`modeconn.match.memory`): a hand-computed case, transform counts
equal to the real transform modules, and the Pythia table's verdicts."""

from __future__ import annotations

import pytest
import torch

from modeconn.errors import ConfigError
from modeconn.match.memory import DUAL_GROUPS, Shape, dual_memory, pythia_table, transform_counts

#: GPT-NeoX, d = 8, one layer, 2 heads of 4 dims (2 rotary), FFN 16, vocabulary 10
TINY = {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16, "vocab_size": 10,
        "rotary_pct": 0.5}


def test_hand_computed_case():
    est = dual_memory(TINY, world=2, dtype=torch.float32, batch=2, seq_len=3, base_bytes=100)
    # stored rows per rank (⌈n/2⌉ × m): embed 5·8, 4 layer-norm vectors 4 each, qkv 12·8 + 12, dense 4·8 + 4,
    # h→4h 8·8 + 8, 4h→h 4·16 + 4, final norm 4 + 4, LM head 5·8; two endpoints of 4-byte elements
    assert est.endpoints == 2 * 4 * (40 + 16 + 96 + 12 + 32 + 4 + 64 + 8 + 64 + 4 + 8 + 40)
    # the largest leaf: the fused QKV projection, its 24 rows split at a head boundary (2 heads of 12 rows: q, k, v),
    # so block-local — its block transformed (6 · 96 fp32 elements) and θ gathered whole (3 · 192) — and its bias
    # transformed whole (6 · 24; one gathered buffer per endpoint); the block-local FFN projection (8·16) costs
    # 4·(3·128 + 6·64) + its bias 16·(24 + 8)
    assert est.leaf == 4 * (3 * 192 + 6 * 96) + 6 * 4 * 24 and est.process == 2 * 4 * 24
    # per side: P = 64 (residual) + 2·(2·1 + 2·2² + 2) (qk) + 2·(2·4² + 4) (vo) = 160, buffers 64 + 48 + 96 = 208,
    # elements 64 (residual, replicated) + (32 + 32) / 2 (each rank's head of qk and vo) = 96: sharded P, grad,
    # 2 moments and the bases / 2 ranks + the elements and their gradients, for both sides
    per_side = (4 * 160 + 208) // 2 + 2 * 96
    assert est.transforms == 4 * 2 * per_side
    assert est.activations == 4 * 1 * 3 * (10 * 8 + 2 * 16 + 3 * 10)  # one row of 3 tokens per rank
    assert est.base == 100
    assert est.total == est.endpoints + est.leaf + est.transforms + est.activations + est.process + 100
    assert dual_memory(TINY, world=1, dtype=torch.float32, batch=2, seq_len=3).process == 0  # no gather
    assert dual_memory(TINY, world=2, dtype=torch.float32, batch=2, seq_len=3, one_sided=True).transforms == 4 * per_side
    one = dual_memory(TINY, world=1, dtype=torch.float32, batch=2, seq_len=3)
    assert one.transforms == 4 * 2 * (4 * 160 + 208 + 2 * 128)  # one process: every element whole


def test_block_local_leaves():
    """Frozen head spaces leave the attention rows free: the QKV weight (24 × 8) becomes block-local — its block
    transformed (6 · ⌈192 / 4⌉ fp32 elements) and only θ gathered whole (3 · 192: θ, ∂θ and its all-reduce) — its
    bias still whole (6 · 24, gathered 2 · 24); embeddings, LM head and FFN matrices are block-local in both groupings;
    one process gathers nothing and transforms every tensor whole. With the learned head spaces the attention matrices
    are block-local where their head axis splits at head boundaries (2 ranks: 12-row QKV blocks of 4-row heads; not 4
    ranks: 6 rows)."""
    from modeconn.match.memory import block_local

    groups = {**DUAL_GROUPS, "qk": "permutation", "vo": "permutation"}
    est = dual_memory(TINY, world=4, dtype=torch.float32, batch=4, seq_len=3, groups=groups)
    assert est.leaf == 4 * (3 * 192 + 6 * 48) + 4 * 6 * 24 and est.process == 2 * 4 * 24
    one = dual_memory(TINY, world=1, dtype=torch.float32, batch=4, seq_len=3, groups=groups)
    assert one.leaf == 6 * 4 * 216 and one.process == 0
    shape, qkv = Shape.from_config(TINY), "gpt_neox.layers.0.attention.query_key_value.weight"
    assert not block_local(qkv, 24, 8, 4, shape) and block_local(qkv, 24, 8, 4, shape, groups)
    assert block_local(qkv, 24, 8, 2, shape)
    for key in ("gpt_neox.embed_in.weight", "embed_out.weight", "gpt_neox.layers.0.mlp.dense_4h_to_h.weight",
                "model.layers.0.mlp.gate_proj.weight"):
        assert block_local(key, 10, 8, 4, shape) and block_local(key, 10, 8, 4, shape, groups)
    dense = "model.layers.0.self_attn.o_proj.weight"  # the head axis is the columns: 8 = 2 heads of 4
    assert block_local(dense, 8, 8, 2, shape) and not block_local(dense, 8, 8, 4, shape)


def test_transform_counts_are_those_of_the_real_transform_modules():
    from hf_tiny import make

    import modeconn as mc
    from modeconn.match.parametrize import make_transform
    from modeconn.symmetry import hf

    model = mc.absorb_normalization(make("gpt_neox", 0))
    spec = hf.hf_symmetry_spec(model, groups=DUAL_GROUPS)
    identity = spec.identity()
    params = buffers = elements = heads = 0
    for s in spec.spaces:
        group = spec.group_of(s)
        if group.exact:
            continue
        m = make_transform(group, identity[s].float())
        params += sum(p.numel() for p in m.parameters())
        buffers += sum(b.numel() for b in m.buffers())
        elements += identity[s].numel()
        heads += identity[s].numel() if group.per_head else 0
    got = transform_counts(Shape.from_config(model.config), DUAL_GROUPS)
    assert got == {"params": params, "buffers": buffers, "elements": elements, "head_elements": heads}


def test_store_term_is_one_nth_of_the_model_and_bf16_halves_it():
    one = dual_memory(TINY, world=1, dtype=torch.float32, batch=8, seq_len=4)
    assert one.endpoints == 2 * 4 * Shape.from_config(TINY).params
    assert dual_memory(TINY, world=1, dtype=torch.bfloat16, batch=8, seq_len=4).endpoints * 2 == one.endpoints
    eight = dual_memory(TINY, world=8, dtype=torch.float32, batch=8, seq_len=4)
    assert one.endpoints / 8 <= eight.endpoints < one.endpoints / 8 * 1.5  # ⌈n/8⌉ rows of small tensors


def test_pythia_table_verdicts():
    rows = {(r["model"], r["world"]): r for r in pythia_table()}
    assert set(rows) == {(m, w) for m in ("pythia-1b", "pythia-2.8b", "pythia-6.9b") for w in (1, 8)}
    assert abs(rows["pythia-6.9b", 1]["params"] / 6.857e9 - 1) < 1e-3  # the published parameter count
    assert rows["pythia-1b", 1]["fits"] and rows["pythia-6.9b", 8]["fits"]
    assert not rows["pythia-6.9b", 1]["fits"]  # batch 8 × 2048 tokens does not fit one 141 GB device
    for m in ("pythia-1b", "pythia-2.8b", "pythia-6.9b"):
        assert rows[m, 8]["endpoints"] < rows[m, 1]["endpoints"] / 7 and rows[m, 8]["max_batch"] > rows[m, 1]["max_batch"]


def test_unsupported_groups_and_worlds_are_refused():
    with pytest.raises(ConfigError, match="ffn must be a permutation frozen"):
        dual_memory(TINY, groups={**DUAL_GROUPS, "ffn": "orthogonal"})
    with pytest.raises(ConfigError, match="1 ≤ world ≤ batch"):
        dual_memory(TINY, world=4, batch=2)
    with pytest.raises(ConfigError, match="needs hidden_size"):
        dual_memory({"hidden_size": 8})


def test_block_local_matches_the_block_axes_of_the_sharded_run():
    """The model's block-local matrices are those the sharded run splits (``_ContinuousPlan.block_axis``), and its
    per-head elements are cut to 1/W on each rank exactly where the run's ranks read disjoint heads
    (``held_units``), for an absorbed GPT-NeoX and a Llama with grouped key/value heads, learned residual and head
    spaces, on 2, 3 and 4 ranks."""
    from hf_tiny import make

    import modeconn as mc
    from modeconn.match.dual import _ContinuousPlan
    from modeconn.match.memory import block_local, heads_split
    from modeconn.match.sharded import row_block
    from modeconn.symmetry import hf

    seen = set()  # whether attention matrices were split: both must occur
    for family in ("gpt_neox", "llama"):
        model = mc.absorb_normalization(make(family, 0))
        spec = hf.hf_symmetry_spec(model, groups=DUAL_GROUPS)
        sd, shape = model.state_dict(), Shape.from_config(model.config)
        plan = _ContinuousPlan(spec, [s for s in spec.spaces if not spec.group_of(s).exact], sd)
        matrices = {k: t for k, t in sd.items() if t.dim() >= 2}
        for world in (2, 3, 4):
            axes = {k: plan.block_axis(k, tuple(t.shape), world) for k, t in sd.items()}
            seen |= {axes[k] is not None for k in matrices if "attn" in k or "attention" in k}
            for k, t in matrices.items():
                assert block_local(k, t.shape[0], t[0].numel(), world, shape) == (axes[k] is not None), (family, k)
            held = [plan.held_units({k: (a, *row_block(sd[k].shape[a], r, world)) for k, a in axes.items()
                                     if a is not None}, sd) for r in range(world)]
            heads = [s for s in spec.spaces if spec.group_of(s).per_head]
            split = all(len({h.get(s) for h in held}) == world and all(h.get(s) for h in held) for s in heads)
            assert heads_split(shape, world) == split, (family, world)
    assert seen == {True, False}
