"""Multi-head latent attention (MLA): MiniCPM3, and DeepSeek-V2/V3 where every layer's MLP is dense.

A layer's attention (``r`` = ``qk_rope_head_dim``, ``n`` = ``qk_nope_head_dim``, ``v`` = ``v_head_dim``)::

    q      = q_b_proj(q_a_layernorm(q_a_proj(x)))          (or q_proj(x) without a query latent, q_lora_rank=None)
             per head [q_nope (n) | q_rot (r)]
    c, k_r = kv_a_proj_with_mqa(x) split [kv_lora_rank | r]  (k_r: one rotary key shared by every head)
    kv     = kv_b_proj(kv_a_layernorm(c))                   per head [k_nope (n) | v (v)]
    score_h = q_nope,h · k_nope,h + RoPE(q_rot,h) · RoPE(k_r);   out = o_proj(concat_h softmax · v_h)

Spaces: the **query latent** and the **KV latent** (their ``*_a`` rows, the RMSNorm weight between, the ``*_b``
columns: hidden spaces, permutations); per layer the **heads** (a head's ``q_b`` rows, nope and rotary, its
``kv_b`` rows, its ``o_proj`` columns); per head the **QK** space over the ``n`` non-rotary dims (``q_nope`` rows
and ``k_nope`` rows: any per-head map ``A`` / ``A^{-T}``) and the **VO** space over ``v`` dims. The rotary dims
belong to no QK space: ``k_r`` is one key for every head and RoPE fixes their order. The ``k_r`` rows of
``kv_a_proj_with_mqa`` read the stream and write no space.
"""

from __future__ import annotations

from torch import nn

from ._common import Walker, join, require
from .prenorm import TABLES, LayerAttention, Table, describe, register
from .registry import ADAPTERS, Adapter
from .structure import Attention, Hidden, KVHead, QueryHead, Structure


def _latent(W: Walker, prefix: str, name: str, a, norm: str, b, size: int) -> Hidden:
    """A latent space: ``a``'s first ``size`` rows, the RMSNorm ``norm`` on it, ``b``'s columns."""
    return Hidden(join(prefix, name), size, a.rows(0, size), b.cols(), W.norm(norm).params())


def mla_attention(W: Walker, t: Table, model: nn.Module, prefix: str, lp: str, base: str) -> LayerAttention:
    cfg = t.config_of(model)
    ap = join(lp, t.attn)
    nh, n, r, v = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    o, kva, kvb = (W.linear(join(ap, x)) for x in ("o_proj", "kv_a_proj_with_mqa", "kv_b_proj"))
    hidden = [_latent(W, prefix, f"{ap}.kv_latent", kva, join(ap, "kv_a_layernorm"), kvb, cfg.kv_lora_rank)]
    if W.has(join(ap, "q_a_proj")):
        qa, qb = W.linear(join(ap, "q_a_proj")), W.linear(join(ap, "q_b_proj"))
        hidden.insert(0, _latent(W, prefix, f"{ap}.q_latent", qa, join(ap, "q_a_layernorm"), qb, cfg.q_lora_rank))
        readers = (qa, kva)
    else:
        qb = W.linear(join(ap, "q_proj"))
        readers = (qb, kva)
    heads = tuple(QueryHead(qb.rows(h * (n + r), n), o.cols(h * v, v), extra=qb.rows(h * (n + r) + n, r))
                  for h in range(nh))
    kv = tuple(KVHead(kvb.rows(h * (n + v), n), kvb.rows(h * (n + v) + n, v), (h,)) for h in range(nh))
    att = Attention(join(prefix, ap), n, heads, kv, v_head_dim=v)
    return LayerAttention(att, readers, o, hidden=tuple(hidden))


def _lm(prefix: str, *extra: str) -> tuple[str, ...]:
    return (f"{prefix}Model", f"{prefix}ForCausalLM", f"{prefix}ForSequenceClassification", *extra)


def _describe_dense(t: Table, model: nn.Module, prefix: str) -> Structure:
    """DeepSeek's layers from ``first_k_dense_replace`` on are Mixture-of-Experts: described only when none is."""
    cfg = model.config
    require(cfg.first_k_dense_replace >= cfg.num_hidden_layers, t.family, "first_k_dense_replace",
            cfg.first_k_dense_replace, f">= num_hidden_layers ({cfg.num_hidden_layers}): every MLP dense; "
            "Mixture-of-Experts layers are described under the Mixture-of-Experts support")
    return describe(t, model, prefix)


register(Table("minicpm3", _lm("MiniCPM3"), attention=mla_attention, rotary=None))
for _mt, _p in (("deepseek_v2", "DeepseekV2"), ("deepseek_v3", "DeepseekV3")):
    _t = Table(_mt, _lm(_p), attention=mla_attention, rotary=None)
    TABLES[_mt] = _t
    ADAPTERS.register(_mt)(Adapter(_mt, lambda m, p, t=_t: _describe_dense(t, m, p), _t.example, _t.classes))
