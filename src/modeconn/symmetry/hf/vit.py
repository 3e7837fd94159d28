"""ViT adapter (pre-LN encoder on patches).

Layout: ``embeddings.patch_embeddings.projection`` (Conv2d, kernel = stride = patch) → prepend ``cls_token`` →
add ``position_embeddings`` → layers (``layernorm_before`` → Q/K/V → O; ``layernorm_after`` → fc1 → act →
fc2) → ``layernorm`` → ``classifier`` on the CLS token (``ViTForImageClassification``) or the ``pooler``.

Stream writers: the projection's output channels (weight axis 0, bias), the CLS token and the position
embeddings (axis 2 of ``(1, tokens, hidden)``), a ``mask_token`` if present, every O and fc2 output.
Attribute names changed in transformers 5 (``layers.i.attention.q_proj``, ``mlp.fc1``) from 4.x
(``encoder.layer.i.attention.attention.query``, ``intermediate.dense``); both are recognised.
``ViTModel`` returns the stream (and a pooler output): by default it is frozen. No rotary embeddings.
"""

from __future__ import annotations

from torch import nn

from ...errors import UnsupportedOperationError
from ._common import Walker, base_path, join, pixel_inputs
from .registry import ADAPTERS, Adapter
from .structure import FFN, Attention, KVHead, QueryHead, Stream, Structure

CLASSES = ("ViTModel", "ViTForImageClassification")


def describe(model: nn.Module, prefix: str) -> Structure:
    cfg = model.config
    W = Walker(model, prefix, "vit")
    base = base_path(model)
    names = {type(model).__name__, *(c.__name__ for c in type(model).__mro__)}
    if not names & set(CLASSES):
        raise UnsupportedOperationError(f"vit adapter: {type(model).__name__} is not supported (supported: {CLASSES})")
    H, nh = cfg.hidden_size, cfg.num_attention_heads
    hd = H // nh
    emb = join(base, "embeddings")
    proj = W.linear(f"{emb}.patch_embeddings.projection")
    writers = [*proj.rows(), W.param(emb, "cls_token", 2), W.param(emb, "position_embeddings", 2)]
    if getattr(W.mod(emb), "mask_token", None) is not None:
        writers.append(W.param(emb, "mask_token", 2))
    frozen = list(W.buffers())
    readers, norms, attentions, ffns = [], [], [], []
    v5 = W.has(join(base, "layers"))
    for i in range(cfg.num_hidden_layers):
        if v5:
            lp = join(base, f"layers.{i}")
            q, k, v, o = (W.linear(f"{lp}.attention.{n}_proj") for n in "qkvo")
            up, down = W.linear(f"{lp}.mlp.fc1"), W.linear(f"{lp}.mlp.fc2")
            attn_path, ffn_path = f"{lp}.attention", f"{lp}.mlp"
        else:
            lp = join(base, f"encoder.layer.{i}")
            q, k, v = (W.linear(f"{lp}.attention.attention.{n}") for n in ("query", "key", "value"))
            o = W.linear(f"{lp}.attention.output.dense")
            up, down = W.linear(f"{lp}.intermediate.dense"), W.linear(f"{lp}.output.dense")
            attn_path, ffn_path = f"{lp}.attention", f"{lp}.intermediate"
        norms += [W.norm(f"{lp}.layernorm_before", [q, k, v]), W.norm(f"{lp}.layernorm_after", [up])]
        readers += [*q.cols(), *k.cols(), *v.cols(), *up.cols()]
        writers += [*o.rows(), *down.rows()]
        heads = tuple(QueryHead(q.rows(h * hd, hd), o.cols(h * hd, hd)) for h in range(nh))
        kv = tuple(KVHead(k.rows(h * hd, hd), v.rows(h * hd, hd), (h,)) for h in range(nh))
        attentions.append(Attention(join(prefix, attn_path), hd, heads, kv))
        ffns.append(FFN(join(prefix, ffn_path), up.out_features, up.rows(), down.cols(), (), str(cfg.hidden_act)))
    heads_ = W.heads_reading(("classifier",), H)
    pooler = join(base, "pooler")
    if W.has(pooler) and W.mod(pooler) is not None:  # its output is a model output: only its input is bound
        pool = W.linear(f"{pooler}.dense")
        readers += pool.cols()
        frozen += [pool.bias] if pool.bias else []
    norms.append(W.norm(join(base, "layernorm"), heads_))
    readers += [c for h in heads_ for c in h.cols()]
    frozen += [h.bias for h in heads_ if h.bias]
    stream = Stream(H, tuple(writers), tuple(norms), tuple(readers), is_output=not heads_)
    return Structure("vit", cfg.model_type, type(model).__name__, prefix, stream, tuple(attentions), tuple(ffns),
                     frozen=tuple(frozen))



ADAPTERS.register("vit")(Adapter("vit", describe, pixel_inputs, CLASSES))
