"""DeBERTa-v2/v3: BERT's post-LN layout with disentangled attention.

Each layer's scores add content→position and position→content terms, ``Q_h · K_pos,hᵀ`` and ``K_h · Q_pos,hᵀ``,
where the position keys and queries are projections of one relative position table, ``encoder.rel_embeddings``
(after ``encoder.LayerNorm`` when ``norm_rel_ebd`` names it): by the layer's own ``key_proj`` / ``query_proj``
(``share_att_key``) or by ``pos_key_proj`` / ``pos_query_proj``. The table is therefore read through residual-stream
columns: its columns and its LayerNorm move with the stream (they are bound as the stream's writer and norm), and
the position projections' rows move with the key (``pos_key_proj``) and query (``pos_query_proj``) rows of each head.
Every per-head map of Q and K (``A`` on Q, ``A^{-T}`` on K) then keeps both extra terms.

Not described (SpecError naming the field): ``conv_kernel_size`` (the convolution after the first layer) and an
``embedding_size`` other than ``hidden_size`` (``embed_proj``).
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from ._common import Walker, base_path, join, require
from .bert import _ABSORB, PostLN, describe_post_ln, example
from .registry import ADAPTERS, Adapter
from .structure import KVHead, QueryHead, Structure

TABLE = PostLN("deberta-v2", ("DebertaV2Model",),
               qkv=("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj"),
               pooled={"DebertaV2ForSequenceClassification": ("pooler.dense", "classifier", "gelu")},
               stream_heads={"DebertaV2ForTokenClassification": "classifier",
                             "DebertaV2ForQuestionAnswering": "qa_outputs"},
               mlm={"DebertaV2ForMaskedLM": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                                            "cls.predictions.decoder", "cls.predictions.bias")})


def _with_position_projections(W: Walker, attn, path: str, stream_readers: list):
    """The layer's heads with ``pos_query_proj`` rows among each head's Q rows and ``pos_key_proj`` rows among its K
    rows (where the layer has them: ``share_att_key=False``)."""
    hd = attn.head_dim
    pq = W.linear(f"{path}.pos_query_proj") if W.has(f"{path}.pos_query_proj") else None
    pk = W.linear(f"{path}.pos_key_proj") if W.has(f"{path}.pos_key_proj") else None
    for p in (pq, pk):
        if p is not None:
            stream_readers += p.cols()
    heads = tuple(QueryHead((*h.q, *(pq.rows(i * hd, hd) if pq else ())), h.o) for i, h in enumerate(attn.heads))
    kv = tuple(KVHead((*g.k, *(pk.rows(i * hd, hd) if pk else ())), g.v, g.queries) for i, g in enumerate(attn.kv_heads))
    return replace(attn, heads=heads, kv_heads=kv)


def describe(model: nn.Module, prefix: str) -> Structure:
    cfg = model.config
    conv = getattr(cfg, "conv_kernel_size", 0)
    require(conv == 0, "deberta-v2", "conv_kernel_size", conv, "0 (no convolution layer)")
    emb = getattr(cfg, "embedding_size", cfg.hidden_size)
    require(emb == cfg.hidden_size, "deberta-v2", "embedding_size", emb, f"hidden_size ({cfg.hidden_size})")
    st = describe_post_ln(TABLE, model, prefix)
    W = Walker(model, prefix, "deberta-v2")
    enc = join(base_path(model), "encoder")
    s = st.stream
    writers, norms, readers = list(s.writers), list(s.norms), list(s.readers)
    if W.has(f"{enc}.rel_embeddings"):
        writers.append(W.param(f"{enc}.rel_embeddings", "weight", 1))
    if W.has(f"{enc}.LayerNorm"):
        norms.append(W.norm(f"{enc}.LayerNorm"))
    layers = join(base_path(model), "encoder.layer")
    attentions = tuple(_with_position_projections(W, a, f"{layers}.{i}.attention.self", readers)
                       for i, a in enumerate(st.attentions))
    return replace(st, stream=replace(s, writers=tuple(writers), norms=tuple(norms), readers=tuple(readers)),
                   attentions=attentions,
                   notes=(*st.notes, "disentangled attention: the relative position table moves with the stream"))


ADAPTERS.register("deberta-v2")(Adapter("deberta-v2", describe, example, TABLE.classes,
                                        absorb=_ABSORB.format("deberta-v2")))
